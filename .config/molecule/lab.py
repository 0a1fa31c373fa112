"""Start and stop the lab hosts of one molecule scenario: its own lab instance (name, subnet),
beside the default `k2lab` instance and any other scenario's, sharing the lab's rootfs, image
store and stand-in engine image.

    python .config/molecule/lab.py up --name mrdma --subnet 10.83.0.0/24 --hosts 2 \
        --inventory INV --group prefill=1 --group decode=1 --var k2_engine=sglang ... \
        [--child router=nodes]
    python .config/molecule/lab.py down --name mrdma --subnet 10.83.0.0/24

`up` starts from fresh hosts: it takes down what an earlier run of the instance left (a run
cut short), so the scenario's sequence needs no destroy before its create. It writes the
inventory (connection variables, [all:vars] with k2_lab=true and the --var pairs) and builds
the stand-in image the lab plan runs (`localhost/k2-standin:lab`) unless it is current. Root
is required, as for every lab operation.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import k2lab as lab
from k2lab.config import LabConfig
from k2lab.errors import LabError
from k2lab.inventory import parse_pairs, parse_var_value
from k2lab.standin import build_standin

# Molecule runs this from the scenario's directory: the lab dir is the checkout's own .lab
# (shared with the tests), unless K2_LAB_DIR names another.
LAB_DIR = Path(os.environ.get("K2_LAB_DIR") or Path(__file__).resolve().parents[2] / ".lab")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=("up", "down"))
    parser.add_argument("--name", required=True, help="lab instance name (1-8 of [a-z0-9])")
    parser.add_argument("--subnet", required=True, help="its /24, e.g. 10.83.0.0/24")
    parser.add_argument("--hosts", type=int, default=2)
    parser.add_argument("--inventory", type=Path)
    parser.add_argument("--group", action="append", default=[], help="NAME=COUNT, in order")
    parser.add_argument("--var", action="append", default=[], help="KEY=VALUE for [all:vars]")
    parser.add_argument(
        "--child", action="append", default=[], help="PARENT=GROUP: [PARENT:children] GROUP"
    )
    args = parser.parse_args(argv)
    cfg = LabConfig(lab_dir=LAB_DIR, name=args.name, subnet=args.subnet)
    try:
        if args.action == "down":
            lab.down(cfg=cfg)
            return 0
        if args.inventory is None:
            parser.error("up needs --inventory")
        groups = {k: int(v) for k, v in parse_pairs(args.group, "--group").items()} or None
        all_vars = {
            k: parse_var_value(v) for k, v in parse_pairs(args.var, "--var").items()
        } or None
        children: dict[str, list[str]] = {}
        for parent, group in parse_pairs(args.child, "--child").items():
            children.setdefault(parent, []).append(group)
        args.inventory.parent.mkdir(parents=True, exist_ok=True)
        lab.down(cfg=cfg)  # hosts of an earlier run cut short: never reused
        lab.up(
            args.hosts,
            inventory=args.inventory,
            groups=groups,
            children=children or None,
            all_vars=all_vars,
            cfg=cfg,
        )
        build_standin(cfg)
    except LabError as exc:
        for problem in exc.problems:
            print(f"lab: {problem}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
