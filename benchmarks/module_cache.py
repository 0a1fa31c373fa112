"""What the module payload cache (callback k2.cluster.module_cache) saves (a benchmark, not a
test).

Runs, in one go, a playbook of ten tasks that use ten different modules on localhost (local
connection, the project's ansible.cfg), alternating the cache turned off
(K2_MODULE_CACHE_DIR=off: Ansible builds every payload again, as it does by default) and on
(a warm cache directory of the run's own), and prints each mode's CPU seconds (the run and
everything it started: min, median, max over the rounds) and their ratio. A run that fails
ends the benchmark with NOT OK and no figure. Usage:

    .venv/bin/python benchmarks/module_cache.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from outcome import NotOk
from outcome import run as run_main

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
PLAYBOOK = """\
- hosts: localhost
  gather_facts: false
  tasks:
    - ansible.builtin.command: 'true'
      changed_when: false
    - ansible.builtin.stat: {path: /etc/hostname}
    - ansible.builtin.file: {path: "{{ scratch }}", state: directory, mode: "0700"}
    - ansible.builtin.copy: {content: "x", dest: "{{ scratch }}/f", mode: "0600"}
    - ansible.builtin.slurp: {src: "{{ scratch }}/f"}
    - ansible.builtin.lineinfile: {path: "{{ scratch }}/f", line: "y"}
    - ansible.builtin.getent: {database: passwd, key: root}
    - ansible.builtin.find: {paths: "{{ scratch }}"}
    - ansible.builtin.tempfile: {path: "{{ scratch }}"}
    - ansible.builtin.uri: {url: "http://127.0.0.1:1", status_code: [-1]}
      failed_when: false
"""


def cpu_of_run(playbook: Path, scratch: Path, cache: str) -> float:
    """CPU seconds of one ansible-playbook run (its process tree) with K2_MODULE_CACHE_DIR=cache."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run(
        [str(BIN / "ansible-playbook"), "-i", "localhost,", "-c", "local",
         "-e", f"ansible_python_interpreter={sys.executable}", "-e", f"scratch={scratch}",
         str(playbook)],
        cwd=ROOT, capture_output=True, text=True, check=False,
        env={**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
             "K2_MODULE_CACHE_DIR": cache},
    )  # fmt: skip
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if out.returncode != 0:
        raise NotOk(f"ansible-playbook (cache {cache}) exited {out.returncode}:\n"
                    f"{out.stdout[-2000:]}{out.stderr[-2000:]}")  # fmt: skip
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        playbook = work / "ten_modules.yml"
        playbook.write_text(PLAYBOOK)
        cache = work / "cache"
        cpu_of_run(playbook, work / "scratch", str(cache))  # warms the cache
        times: dict[str, list[float]] = {"off": [], "on": []}
        for _ in range(args.rounds):
            times["off"].append(cpu_of_run(playbook, work / "scratch", "off"))
            times["on"].append(cpu_of_run(playbook, work / "scratch", str(cache)))
    for mode, values in times.items():
        print(
            f"cache {mode:>3}: {min(values):.2f} / {statistics.median(values):.2f} / "
            f"{max(values):.2f} CPU s (min / median / max over {args.rounds} runs)"
        )
    off, on = statistics.median(times["off"]), statistics.median(times["on"])
    print(f"ratio off/on (medians): {off / on:.2f}x; {(off - on) / 10:.3f} CPU s saved per module")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
