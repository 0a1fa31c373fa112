"""Fix hints are computed: every change a refusal suggests is applied and planned again here,
and must then fit. Hints that cannot fix (a shorter context when the weights do not fit) are
never offered."""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from k2provision.core.records import Tunables
from k2provision.engines import sglang
from k2provision.errors import PlanError
from k2provision.plan.assemble import build_plan
from k2provision.plan.inventory import load_cluster


@dataclass(frozen=True)
class Setup:
    """An inventory to write: pool sizes and [all:vars]."""

    engine: str
    layout: str
    counts: dict[str, int]
    variables: dict[str, str] = field(default_factory=dict)

    def write(self, path: Path) -> Path:
        lines = []
        n = 0
        for pool, count in self.counts.items():
            lines.append(f"[{pool}]")
            for _ in range(count):
                n += 1
                lines.append(f"h{n} ansible_host=10.{n // 250}.{n % 250}.1")
        lines += ["[all:vars]", f"k2_engine={self.engine}", f"k2_layout={self.layout}"]
        lines += [f"{k}={v}" for k, v in self.variables.items()]
        path.write_text("\n".join(lines) + "\n")
        return path


def problems(setup: Setup, tmp_path: Path) -> list[str]:
    with pytest.raises(PlanError, match="; fix: ") as info:
        build_plan(load_cluster(setup.write(tmp_path / "inv.ini")))
    return info.value.problems


def plans(setup: Setup, tmp_path: Path) -> bool:
    try:
        build_plan(load_cluster(setup.write(tmp_path / "applied.ini")))
    except PlanError:
        return False
    return True


def hints(line: str) -> list[str]:
    _, _, fix = line.partition("; fix: ")
    return [h for h in fix.split(", or ") if h]


def applied(setup: Setup, pool: str, hint: str) -> list[Setup]:
    """The setups one hint describes (a node-count hint may name several sizes)."""
    if m := re.match(r"k2_layout=(\w+) on (.*) x \d+ \w+ ", hint):
        layout, pools = m.groups()
        counts = {
            (p or "nodes"): int(n)
            for n, p in re.findall(r"(\d+) nodes?(?: \[(\w+)\])?", pools.split(" x ")[0])
        }
        if layout == "pd":
            counts = {k: v for k, v in counts.items() if k != "nodes"}
        return [replace(setup, layout=layout, counts=counts)]
    if m := re.match(r"the smallest \w+ layout that fits is (k2_layout=.*)", hint):
        return applied(setup, pool, m.group(1))
    if re.match(r"k2_\w+=\w+", hint):  # one setting, or several joined by "and"
        settings = dict(re.findall(r"(k2_\w+)=(\w+)", hint))
        return [replace(setup, variables={**setup.variables, **settings})]
    if " fits on " in hint:  # node counts, each maybe "with" a setting
        found = []
        for option in hint.split(" fits on ", 1)[1].split(" or "):
            size = re.match(r"(\d+) nodes? x", option)
            assert size, hint
            settings = dict(re.findall(r"(k2_\w+)=(\w+)", option))
            found.append(
                replace(
                    setup,
                    counts={**setup.counts, pool: int(size.group(1))},
                    variables={**setup.variables, **settings},
                )
            )
        return found
    raise AssertionError(f"a hint of unknown form: {hint}")


SETUPS = {
    # (sglang on one H100 node has no SGLang fix: test_plan.py checks that it says so.)
    "vllm-tp-1xh100": Setup("vllm", "tp", {"nodes": 1}, {"k2_gpu": "h100"}),
    "sglang-tp-1xh200-128k": Setup("sglang", "tp", {"nodes": 1}),
    "sglang-tp-3-nodes": Setup("sglang", "tp", {"nodes": 3}),
    "sglang-tp-7-gpus": Setup("sglang", "tp", {"nodes": 2}, {"k2_gpus_per_node": "7"}),
    "vllm-tp-thinking-1xh100": Setup(
        "vllm", "tp", {"nodes": 1}, {"k2_gpu": "h100", "k2_model": "moonshotai/Kimi-K2-Thinking"}
    ),
    "vllm-dp-ep-5-nodes": Setup("vllm", "dp_ep", {"nodes": 5}),
    "vllm-dp-ep-1xh100": Setup("vllm", "dp_ep", {"nodes": 1}, {"k2_gpu": "h100"}),
    "sglang-pd-2p5d": Setup("sglang", "pd", {"prefill": 2, "decode": 5}),
    "sglang-pd-32p96d": Setup("sglang", "pd", {"prefill": 32, "decode": 96}),
    "sglang-pd-4p12d-h100": Setup("sglang", "pd", {"prefill": 4, "decode": 12}, {"k2_gpu": "h100"}),
    "sglang-pd-4p2d-h100": Setup("sglang", "pd", {"prefill": 4, "decode": 2}, {"k2_gpu": "h100"}),
    "sglang-pd-4p5d-h800": Setup("sglang", "pd", {"prefill": 4, "decode": 5}, {"k2_gpu": "h800"}),
    "vllm-tp-1xh200-dcp-off": Setup(
        "vllm",
        "tp",
        {"nodes": 1},
        {"k2_model": "moonshotai/Kimi-K2-Instruct", "k2_vllm_decode_context_parallel_size": "1"},
    ),
}


@pytest.mark.parametrize("name", SETUPS)
def test_every_suggested_change_plans(name: str, tmp_path: Path) -> None:
    setup = SETUPS[name]
    lines = problems(setup, tmp_path)
    offered = 0
    for line in lines:
        pool = re.match(r"\[(\w+)\]", line)
        assert pool, line
        for hint in hints(line):
            for candidate in applied(setup, pool.group(1), hint):
                whole = candidate
                if len(lines) > 1 and candidate.layout == setup.layout:
                    # One pool's fix; the other pool's own fix is applied with it.
                    whole = fix_other_pools(candidate, lines, pool.group(1))
                assert plans(whole, tmp_path), f"{name}: {hint} does not plan"
                offered += 1
    assert offered, lines


def fix_other_pools(setup: Setup, lines: list[str], done: str) -> Setup:
    for line in lines:
        pool = re.match(r"\[(\w+)\]", line)
        if pool and pool.group(1) != done:
            first = applied(setup, pool.group(1), hints(line)[0])[0]
            setup = replace(
                setup,
                counts={**setup.counts, pool.group(1): first.counts[pool.group(1)]},
                variables={**first.variables, **setup.variables},
            )
    return setup


def test_a_shorter_context_is_offered_only_when_it_fixes(tmp_path: Path) -> None:
    (fits_shorter,) = problems(SETUPS["sglang-tp-1xh200-128k"], tmp_path)
    assert "k2_context_length=" in fits_shorter
    (weights_too_big,) = problems(Setup("sglang", "tp", {"nodes": 1}, {"k2_gpu": "h100"}), tmp_path)
    assert "k2_context_length" not in weights_too_big
    divisible = problems(SETUPS["sglang-tp-3-nodes"], tmp_path)
    assert not any("k2_context_length" in line for line in divisible)


def test_seven_gpus_per_node_names_k2_gpus_per_node(tmp_path: Path) -> None:
    # 14 ranks split neither the heads nor the FP8 experts' and MLPs' 128-wide blocks.
    lines = problems(SETUPS["sglang-tp-7-gpus"], tmp_path)
    assert any("attention heads" in line for line in lines)
    assert any("2048 split over 14 ranks" in line for line in lines)
    assert all("k2_gpus_per_node=8" in line for line in lines)


def test_two_prefill_five_decode_is_offered_the_redundant_experts_that_work(
    tmp_path: Path,
) -> None:
    (line,) = problems(SETUPS["sglang-pd-2p5d"], tmp_path)
    assert line.startswith("[decode] (5 nodes x 8 h200)")
    assert "k2_decode_redundant_experts=16 (384 + 16 expert slots over ep 40)" in line
    assert "4 nodes x 8 h200" in line
    assert "6 nodes x 8 h200" in line


def test_a_large_fleet_is_told_the_valid_sizes_near_what_it_asked(tmp_path: Path) -> None:
    # 768 spare slots also take the decode pool's memory (DeepEP sizes its buffers by every
    # expert slot): a third line says so, with the same fix.
    prefill, decode, *memory = problems(SETUPS["sglang-pd-32p96d"], tmp_path)
    assert all("48 nodes x 8 h200" in line for line in memory)
    assert "[prefill] fits on 24 nodes x 8 h200" in prefill
    assert "or 48 nodes x 8 h200" in prefill
    assert "48 nodes x 8 h200" in decode
    assert "k2_decode_redundant_experts=384" in decode
    assert "that fits is" not in prefill


def test_refusals_are_single_lines_per_problem(tmp_path: Path) -> None:
    for name, setup in SETUPS.items():
        for line in problems(setup, tmp_path):
            assert "\n" not in line, name
            assert "fix:" in line, name


def test_the_documented_refusal_examples_are_what_plan_prints(tmp_path: Path) -> None:
    design = (Path(__file__).resolve().parents[3] / "docs" / "design.md").read_text()
    examples = {
        "vllm-tp-thinking-1xh100": "error: [nodes] (1 node x 8 h100)",
        "sglang-pd-2p5d": "error: [decode] (5 nodes x 8 h200)",
    }
    for name, start in examples.items():
        inv = SETUPS[name].write(tmp_path / f"{name}.ini")
        out = subprocess.run(
            [sys.executable, "-m", "k2provision.cli", "plan", str(inv)],
            capture_output=True,
            text=True,
            check=False,
        )
        assert out.returncode == 2
        (line,) = [line for line in out.stderr.splitlines() if line.startswith(start)]
        assert f"  {line}\n" in design, line


def test_decode_context_parallelism_is_offered_where_it_fixes(tmp_path: Path) -> None:
    (line,) = problems(SETUPS["vllm-tp-1xh200-dcp-off"], tmp_path)
    assert "k2_vllm_decode_context_parallel_size=8" in line
    assert "vllm tp fits on 2 nodes x 8 h200 (tp 16; 16 GPUs)" in line


def test_pd_on_80_gb_gpus_is_offered_the_largest_decode_batch_that_fits(tmp_path: Path) -> None:
    (decode,) = problems(SETUPS["sglang-pd-4p12d-h100"], tmp_path)
    assert decode.startswith("[decode]")
    (hint,) = [h for h in hints(decode) if h.startswith("k2_cuda_graph_max_bs_decode=")]
    value = int(hint.split("=")[1].split()[0])
    default = Tunables.model_fields["cuda_graph_max_bs_decode"].default
    assert value < default
    setup = SETUPS["sglang-pd-4p12d-h100"]
    assert plans(
        replace(setup, variables={**setup.variables, "k2_cuda_graph_max_bs_decode": str(value)}),
        tmp_path,
    )
    # The next larger value tried does not fit: the hint is the largest batch that does.
    (knob,) = sglang.BATCH_TUNABLES
    bigger = min(v for v in (*knob.candidates, default) if v > value)
    assert not plans(
        replace(setup, variables={**setup.variables, "k2_cuda_graph_max_bs_decode": str(bigger)}),
        tmp_path,
    )


@pytest.mark.parametrize("gpu", ["h100", "h800"])
def test_pd_decode_on_80_gb_gpus_is_offered_node_counts_with_a_smaller_batch(
    gpu: str, tmp_path: Path
) -> None:
    """At the default batch the decode pool fits at no node count on 80 GB GPUs (its CUDA
    graphs and DeepEP buffers grow with the pool): the counts come with the batch that fits."""
    setup = Setup("sglang", "pd", {"prefill": 4, "decode": 2}, {"k2_gpu": gpu})
    (decode,) = problems(setup, tmp_path)
    assert decode.startswith("[decode]")
    assert "no change near" not in decode
    (hint,) = hints(decode)
    assert hint.startswith(f"sglang pd [decode] fits on 3 nodes x 8 {gpu} ")
    assert "with k2_cuda_graph_max_bs_decode=" in hint
    (fixed,) = applied(setup, "decode", hint)
    assert plans(fixed, tmp_path)


def test_pd_decode_is_offered_redundant_experts_with_a_smaller_batch(tmp_path: Path) -> None:
    setup = SETUPS["sglang-pd-4p5d-h800"]
    lines = problems(setup, tmp_path)
    both = [h for line in lines for h in hints(line) if h.startswith("k2_decode_redundant")]
    assert both
    assert all(" and k2_cuda_graph_max_bs_decode=" in h for h in both)
    for hint in both:
        (fixed,) = applied(setup, "decode", hint)
        assert plans(fixed, tmp_path), hint
