"""How fast `k2provision status` answers for a cluster (a benchmark, not a test).

On N lab hosts (default 16) running a launched plan (vLLM DP+EP, stand-in engines), it times in
one run:
  - `k2provision status` (every host's containers, spec hashes, gates, logs and the endpoint,
    over one parallel SSH session per host);
  - the least a playbook run per question costs: one ad-hoc `ansible` command (`docker ps`) on
    every host with the project's ansible.cfg;
and prints the times and their ratio. Any step that fails ends the benchmark with NOT OK and its
reason, no figure, exit 1. Needs root (the lab). Usage:

    .venv/bin/python benchmarks/status_speed.py [--hosts 16] [--rounds 3]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

import dp_ep_lab
from dp_ep_lab import BIN, ROOT, WRITE_CHECKPOINT, ansible_env
from outcome import NotOk
from outcome import run as run_main

import k2lab as lab


def timed(argv: list[str], expect: int = 0) -> float:
    """Run argv from the repository root; its wall time, or NotOk with its output."""
    started = time.monotonic()
    out = subprocess.run(
        argv, cwd=ROOT, env=ansible_env(ROOT / "ansible.cfg"), capture_output=True, text=True
    )
    elapsed = time.monotonic() - started
    if out.returncode != expect:
        raise NotOk(f"{' '.join(argv[:3])} exited {out.returncode}, not {expect}:\n"
                    f"{out.stdout[-3000:]}{out.stderr[-2000:]}")  # fmt: skip
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    state, inventory, cfg = dp_ep_lab.up(args.hosts, name="k2stat", subnet="10.80.0.0/24")
    try:
        for host in state.hosts:
            out = subprocess.run(
                lab.ssh_command(state, host.name, WRITE_CHECKPOINT), capture_output=True, text=True
            )
            if out.returncode != 0:
                raise NotOk(f"checkpoint stub on {host.name} exited {out.returncode}:"
                            f" {out.stderr[-1000:]}")  # fmt: skip
        timed(
            [
                str(BIN / "ansible-playbook"),
                "-i",
                str(inventory),
                "playbooks/site.yml",
                "--tags",
                "launch,verify",
            ]
        )
        status = [str(BIN / "k2provision"), "status", str(inventory)]
        adhoc = [
            str(BIN / "ansible"),
            "-i",
            str(inventory),
            "all",
            "-m",
            "ansible.builtin.command",
            "-a",
            "docker ps -a",
        ]
        times: dict[str, list[float]] = {"status": [], "ansible": []}
        for _ in range(args.rounds):
            times["status"].append(timed(status))
            times["ansible"].append(timed(adhoc))
    finally:
        lab.down(cfg)
    best = {name: min(values) for name, values in times.items()}
    print(f"\n{args.hosts} lab hosts, vLLM DP+EP stand-in, {args.rounds} round(s), best of each")
    print(f"{'question':<44}{'s':>8}")
    print(f"{'k2provision status (everything, endpoint too)':<44}{best['status']:>8.1f}")
    print(f"{'ansible ad-hoc docker ps (one command)':<44}{best['ansible']:>8.1f}")
    print(
        f"status answers in {best['status'] / best['ansible']:.2f}x the time of one "
        "ad-hoc Ansible command"
    )
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
