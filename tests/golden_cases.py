"""Golden cases: an inventory in, everything the plan decides out.

Each folder under tests/golden/ holds ``inventory.ini`` and ``expected.json``: the whole plan
(layout, ranks, memory fit, ports, every process's argv, env and files) and, per host, the exact
``docker run`` / ``docker exec`` argv that starts each process (the container command, options
and spec-hash label included). tests/k2provision/unit/test_golden.py only compares;
``scripts/regen-goldens`` rewrites the expectations for a person to review as a diff.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from k2provision.plan.assemble import build_plan
from k2provision.plan.containers import exec_argv, run_argv
from k2provision.plan.inventory import load_cluster

GOLDEN = Path(__file__).resolve().parent / "golden"
CASES = sorted(p.name for p in GOLDEN.iterdir() if (p / "inventory.ini").exists())


def observed(case: str) -> dict[str, Any]:
    """What a golden case pins down, as plain JSON data."""
    plan = build_plan(load_cluster(GOLDEN / case / "inventory.ini"))
    docker = {
        host.name: {
            proc.name: exec_argv(proc, plan.config_dir)
            if proc.exec_in
            else run_argv(plan.container, proc, plan.config_dir, host.files)
            for proc in host.processes
        }
        for host in plan.hosts
    }
    return {"plan": plan.model_dump(mode="json"), "docker": docker}


def render(case: str) -> str:
    """The expected.json text of a case (stable key order, one trailing newline)."""
    return json.dumps(observed(case), indent=2, sort_keys=True) + "\n"


def expected_path(case: str) -> Path:
    return GOLDEN / case / "expected.json"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description="Rewrite tests/golden/*/expected.json.")
    parser.add_argument("cases", nargs="*", help=f"cases to rewrite (default: all of {CASES})")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.cases) - set(CASES))
    if unknown:
        print(
            f"regen-goldens: no golden case {', '.join(unknown)}; cases: {', '.join(CASES)}",
            file=sys.stderr,
        )
        return 2
    for case in args.cases or CASES:
        path = expected_path(case)
        text = render(case)
        before = path.read_text() if path.exists() else ""
        path.write_text(text)
        print(f"{case}: {'unchanged' if before == text else 'rewritten'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
