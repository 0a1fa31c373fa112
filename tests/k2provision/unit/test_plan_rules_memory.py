"""The memory, restart and smaller-truth rules (tests/k2provision/plan_rules_memory.py) over
every plan the catalog admits (tests/k2provision/plan_space.py: every engine, layout, model, GPU
type, node count 1-32 and context length, default tunables), and over the FP8 KV cache, which
the plan space leaves at its default: the catalog's models x engines x their layouts x 1, 2 and
4 nodes x context lengths, on H200 and B200 nodes."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from k2provision.core import catalog
from k2provision.core.records import Plan
from k2provision.engines import REGISTRY
from k2provision.engines.base import layout_names
from k2provision.errors import InventoryError, PlanError
from k2provision.plan.assemble import build_plan
from k2provision.plan.inventory import load_cluster
from tests.k2provision import plan_space
from tests.k2provision.plan_rules_memory import problems

NODE_COUNTS = (1, 2, 4)
GPUS = ("h200", "b200")
KV_DTYPES = ("fp8",)
CONTEXTS = (None, 131072)


def _inventory(
    engine: str, layout: str, model: str, nodes: int, gpu: str, kv: str, context: int | None
) -> str:
    if layout == "pd":
        groups = "[prefill]\np1 ansible_host=10.9.0.1\n[decode]\n" + "".join(
            f"d{i} ansible_host=10.9.1.{i + 1}\n" for i in range(nodes)
        )
    else:
        groups = "[nodes]\n" + "".join(f"n{i} ansible_host=10.9.0.{i + 1}\n" for i in range(nodes))
    settings = {
        "k2_engine": engine,
        "k2_layout": layout,
        "k2_model": model,
        "k2_model_dir": "/models/" + model.rsplit("/", maxsplit=1)[-1],
        "k2_gpu": gpu,
        "k2_kv_cache_dtype": kv,
    }
    if context:
        settings["k2_context_length"] = str(context)
    return groups + "[all:vars]\n" + "".join(f"{k}={v}\n" for k, v in settings.items())


def admitted_plans(tmp: Path) -> list[tuple[str, Plan]]:
    """Every plan of the enumeration that the plan accepts, with its name."""
    found = []
    combos = itertools.product(catalog.MODELS, REGISTRY, NODE_COUNTS, GPUS, KV_DTYPES, CONTEXTS)
    for model, engine, nodes, gpu, kv, context in combos:
        for layout in layout_names(REGISTRY[engine].LAYOUTS):
            name = f"{engine}-{layout}-{model.split('/')[-1]}-{nodes}n-{gpu}-{kv}-{context}"
            path = tmp / f"{name}.ini"
            path.write_text(_inventory(engine, layout, model, nodes, gpu, kv, context))
            try:
                found.append((name, build_plan(load_cluster(path))))
            except (InventoryError, PlanError):
                continue
    return found


@pytest.fixture(scope="module")
def plans(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[str, Plan]]:
    return admitted_plans(tmp_path_factory.mktemp("space"))


def test_the_fp8_kv_enumeration_admits_plans_of_the_engines_that_take_it(
    plans: list[tuple[str, Plan]],
) -> None:
    # The plan refuses k2_kv_cache_dtype=fp8 for TensorRT-LLM (its own variable sets the KV
    # dtype) and KTransformers (no FP8 KV cache).
    assert {p.engine for _, p in plans} == {"sglang", "vllm"}
    assert any(p.container.compile_cache for _, p in plans)


def test_every_admitted_plan_keeps_the_memory_and_restart_rules(
    plans: list[tuple[str, Plan]],
) -> None:
    broken = {name: found for name, plan in plans if (found := problems(plan))}
    assert broken == {}


def test_every_plan_of_the_plan_space_keeps_the_memory_and_restart_rules() -> None:
    admitted = plan_space.admitted()
    assert {a.engine for a in admitted} == set(REGISTRY)
    broken = {a.label: found for a in admitted if (found := problems(plan_space.plan_of(a)))}
    assert broken == {}
