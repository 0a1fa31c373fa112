"""What the project's ansible.cfg and the look (converge by difference) buy on a cluster-sized
run (a benchmark, not a test).

On N lab hosts (default 16) it times `site.yml --tags launch,verify`, in one run, three ways:
  - stock: stock Ansible settings (only the roles and collections paths set), every task run
    (-e k2_full_converge=true), as before the look existed;
  - project: the project's ansible.cfg, every task run (the switch);
  - converge: the project's ansible.cfg with the look: only what differs runs;
each for
  - a first apply: launch + verify from nothing (files written, containers started);
  - a no-op re-apply on the converged hosts;
  - a re-apply after one host drifted (one rendered file changed, one container removed); the
    run must put both back.
and prints the times and the speed-ups over stock. Any run that fails ends the benchmark with
NOT OK and its reason, no figure, exit 1 (the lab is taken down). Needs root (the lab). The lab
instance is K2_LAB_NAME / K2_LAB_SUBNET when set (else k2bench, 10.79.0.0/24). Usage:

    .venv/bin/python benchmarks/ansible_speed.py [--hosts 16] [--rounds 1]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import dp_ep_lab
from dp_ep_lab import BIN, ROOT, WRITE_CHECKPOINT, ansible_env, on_host
from outcome import NotOk
from outcome import run as run_main

import k2lab as lab

STOCK_CFG = """[defaults]
roles_path = {root}/roles
collections_path = {root}/k2provision/ansible/collections
"""


RUNS = ("first apply", "no-op re-apply", "one host drifted")


def playbook(inventory: Path, config: Path, *extra: str) -> float:
    """Run site.yml (launch, verify) and return its wall time; NotOk if it fails."""
    env = ansible_env(config)
    started = time.monotonic()
    out = subprocess.run(
        [
            str(BIN / "ansible-playbook"),
            "-i",
            str(inventory),
            "playbooks/site.yml",
            "--tags",
            "launch,verify",
            *extra,
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    elapsed = time.monotonic() - started
    if out.returncode != 0:
        raise NotOk(f"ansible-playbook with {config.name} exited {out.returncode}:\n"
                    f"{out.stdout[-3000:]}{out.stderr[-2000:]}")  # fmt: skip
    return elapsed


DRIFT_FILE = "ls /etc/k2provision/launch/*.sh | head -1"
DRIFT_CONTAINER = "docker ps --format '{{.Names}}' --filter name=k2- | sort | head -1"


def drift(state: lab.LabState) -> tuple[str, str, str]:
    """On the first host: append a line to one rendered file and remove one container; (the
    file, its content before, the container)."""
    host = state.hosts[0].name
    path = on_host(state, host, DRIFT_FILE).strip()
    container = on_host(state, host, DRIFT_CONTAINER).strip()
    if not path or not container:
        raise NotOk(f"{host} has no rendered launch script or no k2 container to drift")
    before = on_host(state, host, f"cat {path}")
    on_host(state, host, f"echo '# drifted' >> {path}; docker rm --force {container} >/dev/null")
    return path, before, container


def fixed(state: lab.LabState, path: str, before: str, container: str) -> None:
    """NotOk unless the drifted file and container are back as planned."""
    host = state.hosts[0].name
    if on_host(state, host, f"cat {path}") != before:
        raise NotOk(f"{host}: {path} still differs from the plan after the re-apply")
    inspect = f"docker container inspect -f '{{{{.State.Running}}}}' {container}"
    running = on_host(state, host, inspect)
    if running.strip() != "true":
        raise NotOk(f"{host}: container {container} is not running after the re-apply")


def reset(state: lab.LabState) -> None:
    """Back to nothing: no k2 containers, no rendered files."""
    for host in state.hosts:
        out = subprocess.run(
            lab.ssh_command(
                state,
                host.name,
                "docker rm -f $(docker ps -aq --filter name=k2-) >/dev/null 2>&1; "
                f"rm -rf /etc/k2provision; {WRITE_CHECKPOINT}",
            ),
            capture_output=True,
            text=True,
        )
        if out.returncode != 0:
            raise NotOk(f"reset of {host.name} exited {out.returncode}: {out.stderr[-1000:]}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    state, inventory, cfg = dp_ep_lab.up(
        args.hosts,
        name=os.environ.get("K2_LAB_NAME", "k2bench"),
        subnet=os.environ.get("K2_LAB_SUBNET", "10.79.0.0/24"),
    )
    tuned = ROOT / "ansible.cfg"
    stock = inventory.parent / "stock.cfg"
    stock.write_text(STOCK_CFG.format(root=ROOT))
    full = ("-e", "k2_full_converge=true")
    ways = (("stock", stock, full), ("project", tuned, full), ("converge", tuned, ()))
    results: dict[str, dict[str, list[float]]] = {name: {} for name, _, _ in ways}
    try:
        for _ in range(args.rounds):
            for name, config, extra in ways:
                reset(state)
                times = results[name]
                times.setdefault(RUNS[0], []).append(playbook(inventory, config, *extra))
                times.setdefault(RUNS[1], []).append(playbook(inventory, config, *extra))
                drifted = drift(state)
                times.setdefault(RUNS[2], []).append(playbook(inventory, config, *extra))
                fixed(state, *drifted)
        reset(state)
    finally:
        lab.down(cfg)
    print(
        f"\n{args.hosts} lab hosts, vLLM DP+EP stand-in, launch+verify, "
        f"{args.rounds} round(s), best of each; {os.cpu_count()} CPUs, load average "
        f"{os.getloadavg()[0]:.1f} at the end"
    )
    print(
        f"{'run':<22}{'stock s':>9}{'project s':>11}{'converge s':>12}"
        f"{'project':>9}{'converge':>10}"
    )
    for run in RUNS:
        s, p, c = (min(results[name][run]) for name, _, _ in ways)
        print(f"{run:<22}{s:>9.1f}{p:>11.1f}{c:>12.1f}{s / p:>8.2f}x{s / c:>9.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
