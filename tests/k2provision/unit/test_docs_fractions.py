"""docs/engines.md quotes the memory fractions the renders use: every fraction flag in the
k2provision column of a section about a golden case is the value the plan renders for that
case (the pool's servers, under "Prefill only:" / "Decode only:"), recomputed from the code."""

from __future__ import annotations

import re
from pathlib import Path

from k2provision.plan.assemble import build_plan
from k2provision.plan.inventory import load_cluster

ROOT = Path(__file__).resolve().parents[3]
DOC = ROOT / "docs" / "engines.md"
GOLDEN = ROOT / "tests" / "golden"
FLAGS = (
    "--mem-fraction-static",
    "--gpu-memory-utilization",
    "--kv_cache_free_gpu_memory_fraction",
)
QUOTE = re.compile(r"(" + "|".join(FLAGS) + r") ([0-9.]+)")
SECTION = re.compile(r"^## .*\(.*goldens? (.*)\)$")
POOL = {"Prefill only:": "prefill", "Decode only:": "decode"}


def rendered(case: str, pool: str | None) -> set[tuple[str, str]]:
    """(flag, value) of every server of the case (of one pool when given)."""
    plan = build_plan(load_cluster(GOLDEN / case / "inventory.ini"))
    found = set()
    for host in plan.hosts:
        if pool and host.pool != pool:
            continue
        for proc in host.processes:
            for flag in FLAGS:
                if flag in proc.argv:
                    found.add((flag, proc.argv[proc.argv.index(flag) + 1]))
    return found


def quoted() -> list[tuple[list[str], str | None, str, str]]:
    """(golden cases, pool, flag, value) for every fraction in a k2provision column."""
    out = []
    cases: list[str] = []
    pool = None
    for line in DOC.read_text().splitlines():
        if m := SECTION.match(line):
            cases, pool = re.findall(r"`([a-z0-9.-]+)`", m.group(1)), None
        elif line.startswith("## "):
            cases, pool = [], None
        elif line in POOL:
            pool = POOL[line]
        elif line in ("Router:",):
            pool = None
        elif cases and line.startswith("|"):
            first = line.split("|")[1]
            out += [(cases, pool, flag, value) for flag, value in QUOTE.findall(first)]
    return out


def test_the_docs_quote_fractions_for_every_engine() -> None:
    flags = {flag for _, _, flag, _ in quoted()}
    assert flags == set(FLAGS)
    assert len(quoted()) >= 6


def test_every_quoted_fraction_is_the_rendered_one() -> None:
    wrong = [
        f"{cases} {pool or ''} {flag} {value}: renders {sorted(rendered(cases[0], pool))}"
        for cases, pool, flag, value in quoted()
        if any((flag, value) not in rendered(case, pool) for case in cases)
    ]
    assert wrong == []
