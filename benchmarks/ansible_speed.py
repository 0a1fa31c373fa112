"""How much the project's ansible.cfg buys on a cluster-sized run (a benchmark, not a test).

On N lab hosts (default 16) it times, in one run, with the project's ansible.cfg and with stock
Ansible settings (only the roles and collections paths set):
  - a first apply: launch + verify from nothing (files written, containers started);
  - a no-op re-apply on the converged hosts.
and prints the times and the ratios. Any run that fails ends the benchmark with NOT OK and its
reason, no figure, exit 1 (the lab is taken down). Needs root (the lab). Usage:

    .venv/bin/python benchmarks/ansible_speed.py [--hosts 16] [--rounds 1]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import dp_ep_lab
from dp_ep_lab import BIN, ROOT, WRITE_CHECKPOINT, ansible_env
from outcome import NotOk
from outcome import run as run_main

import k2lab as lab

STOCK_CFG = """[defaults]
roles_path = {root}/roles
collections_path = {root}/k2provision/ansible/collections
"""


def playbook(inventory: Path, config: Path, *extra: str) -> float:
    """Run site.yml (launch, verify) and return its wall time; NotOk if it fails."""
    env = ansible_env(config)
    started = time.monotonic()
    out = subprocess.run(
        [str(BIN / "ansible-playbook"), "-i", str(inventory), "playbooks/site.yml",
         "--tags", "launch,verify", *extra],
        cwd=ROOT, env=env, capture_output=True, text=True,
    )
    elapsed = time.monotonic() - started
    if out.returncode != 0:
        raise NotOk(f"ansible-playbook with {config.name} exited {out.returncode}:\n"
                    f"{out.stdout[-3000:]}{out.stderr[-2000:]}")  # fmt: skip
    return elapsed


def reset(state: lab.LabState) -> None:
    """Back to nothing: no k2 containers, no rendered files."""
    for host in state.hosts:
        out = subprocess.run(
            lab.ssh_command(state, host.name,
                            "docker rm -f $(docker ps -aq --filter name=k2-) >/dev/null 2>&1; "
                            f"rm -rf /etc/k2provision; {WRITE_CHECKPOINT}"),
            capture_output=True, text=True,
        )
        if out.returncode != 0:
            raise NotOk(f"reset of {host.name} exited {out.returncode}: {out.stderr[-1000:]}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    state, inventory, cfg = dp_ep_lab.up(args.hosts, name="k2bench", subnet="10.79.0.0/24")
    tuned = ROOT / "ansible.cfg"
    stock = inventory.parent / "stock.cfg"
    stock.write_text(STOCK_CFG.format(root=ROOT))
    results: dict[str, dict[str, list[float]]] = {"tuned": {}, "stock": {}}
    try:
        for _ in range(args.rounds):
            for name, config in (("stock", stock), ("tuned", tuned)):
                reset(state)
                first = playbook(inventory, config)
                noop = playbook(inventory, config)
                results[name].setdefault("first apply", []).append(first)
                results[name].setdefault("no-op re-apply", []).append(noop)
        reset(state)
    finally:
        lab.down(cfg)
    print(f"\n{args.hosts} lab hosts, vLLM DP+EP stand-in, launch+verify, "
          f"{args.rounds} round(s), best of each")
    print(f"{'run':<16}{'stock s':>10}{'tuned s':>10}{'speed-up':>10}")
    for run in ("first apply", "no-op re-apply"):
        s, t = min(results["stock"][run]), min(results["tuned"][run])
        print(f"{run:<16}{s:>10.1f}{t:>10.1f}{s / t:>9.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
