"""Over every plan the catalog admits (tests/k2provision/plan_space.py): each weight slice the
rendered command lines and configs ask for loads in the pinned release, each MoE kernel path they
select exists for the weight format, and `models`' fewest-node figures and the fix hints agree
with the same enumeration.

The rules are read off the renders (flags and YAML), not the plan's fields, and are stated here
from the pinned sources (docs/engines.md, "Splits and kernel paths"), independently of
plan/shapes.py and the engines' weight_slices:
- FP8 128x128 blocks: every per-GPU slice of an intermediate dimension is a multiple of 128
  (SGLang 0.5.23 fp8.py Fp8MoEMethod.create_weights; vLLM 0.33.0 fp8_utils.py
  validate_fp8_block_shape(_moe)).
- INT4 groups of 32 on Marlin: a multiple of 64 (vLLM marlin_utils.py
  check_moe_marlin_supports_config).
- BF16: a whole number.
- SGLang's DeepEP MoE runs FP8 experts only (ep_moe/layer.py DeepEPMoE.run_moe_core); vLLM's
  EPLB runs only with methods that support it (FP8 here; INT4 Marlin does not); TensorRT-LLM's
  CUTLASS FP8 block-scale MoE GEMM is built for Hopper only ("fp8 blockscale gemm only support
  Hopper"), so Blackwell needs the DEEPGEMM (or TRTLLM) backend named.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from dataclasses import dataclass

import pytest
import yaml

from k2provision.commands.models_table import UNSERVED, rows
from k2provision.core import catalog
from k2provision.core.records import GpuSpec, ModelSpec, Plan, WeightFormat
from k2provision.engines import REGISTRY
from k2provision.errors import PlanError
from k2provision.plan.assemble import build_plan
from tests.k2provision import plan_space

TRTLLM_OPTIONS = "trtllm/extra-llm-api-config.yml"


@dataclass(frozen=True)
class Rendered:
    """What one rendered server asks of the weights: the ranks each MLP weight is cut over,
    and the MoE path it selects."""

    expert: int
    shared: int
    dense: int
    deepep: bool = False
    eplb: bool = False
    spare_experts: int = 0
    moe_backend: str | None = None


def flag(argv: tuple[str, ...], name: str, default: str | None = None) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else default


def number(argv: tuple[str, ...], name: str, default: int = 1) -> int:
    value = flag(argv, name)
    return default if value is None else int(value)


def sglang_server(argv: tuple[str, ...]) -> Rendered:
    tp = number(argv, "--tp-size")
    ep = number(argv, "--ep-size")
    deepep = flag(argv, "--moe-a2a-backend") == "deepep"
    return Rendered(
        expert=tp // ep,
        # DeepEP replicates the shared experts (deepseek_v2.py `_shared_expert_use_tp1`).
        shared=1 if deepep else tp,
        dense=1 if flag(argv, "--moe-dense-tp-size") == "1" else tp,
        deepep=deepep,
        eplb="--enable-eplb" in argv,
        spare_experts=number(argv, "--ep-num-redundant-experts", 0),
        moe_backend=flag(argv, "--moe-runner-backend"),
    )


def vllm_server(argv: tuple[str, ...]) -> Rendered:
    tp = number(argv, "--tensor-parallel-size")
    config = flag(argv, "--eplb-config")
    return Rendered(
        expert=1 if "--enable-expert-parallel" in argv else tp,
        shared=tp,
        dense=tp,
        deepep=(flag(argv, "--all2all-backend") or "").startswith("deepep"),
        eplb="--enable-eplb" in argv,
        spare_experts=json.loads(config)["num_redundant_experts"] if config else 0,
        moe_backend=flag(argv, "--moe-backend"),
    )


def trtllm_server(argv: tuple[str, ...], options: dict[str, object]) -> Rendered:
    tp = number(argv, "--tp_size")
    ep = number(argv, "--ep_size")
    attention_dp = options.get("enable_attention_dp") is True
    moe = options.get("moe_config")
    return Rendered(
        expert=tp // ep,
        shared=1 if attention_dp else tp,
        dense=1 if attention_dp else tp,
        moe_backend=str(moe.get("backend")) if isinstance(moe, dict) else None,
    )


def servers(plan: Plan) -> list[Rendered]:
    """Every rendered engine server of the plan, read from its argv (and YAML)."""
    out = []
    for host in plan.hosts:
        for proc in host.processes:
            argv = proc.argv
            if "sglang.launch_server" in argv:
                out.append(sglang_server(argv))
            elif argv[:2] == ("vllm", "serve"):
                out.append(vllm_server(argv))
            elif "trtllm-serve" in argv:
                (path,) = [f for f in host.files if f.endswith(TRTLLM_OPTIONS)]
                options = yaml.safe_load(host.files[path])
                assert isinstance(options, dict)
                out.append(trtllm_server(argv[argv.index("trtllm-serve") :], options))
    return out


def quantum(fmt: WeightFormat) -> int:
    return {"fp8_block": 128, "int4_group": 64}.get(fmt.scheme, 1)


def slice_faults(r: Rendered, spec: ModelSpec) -> list[str]:
    q = spec.quantization
    faults = []
    for what, size, ranks, fmt in (
        ("expert", spec.moe_intermediate_size, r.expert, q.routed_experts),
        ("shared", spec.moe_intermediate_size * spec.n_shared_experts, r.shared, q.shared_experts),
        ("dense", spec.intermediate_size, r.dense, q.dense_mlp),
    ):
        if size % ranks or (size // ranks) % quantum(fmt):
            faults.append(f"{what} {size}/{ranks} in {fmt.label}")
    return faults


def path_faults(engine: str, r: Rendered, spec: ModelSpec, gpu: GpuSpec) -> list[str]:
    experts = spec.quantization.routed_experts.scheme
    faults = []
    hopper_only = r.moe_backend in (None, "AUTO", "CUTLASS")
    if engine == "trtllm" and experts == "fp8_block" and gpu.sm >= 100 and hopper_only:
        faults.append(f"TensorRT-LLM FP8 block-scale CUTLASS MoE on sm {gpu.sm}")
    if engine == "sglang" and r.deepep and experts != "fp8_block" and r.moe_backend is None:
        faults.append(f"SGLang DeepEP MoE with {experts} experts")
    if engine == "vllm" and r.eplb and experts != "fp8_block":
        faults.append(f"vLLM EPLB with {experts} experts")
    if r.spare_experts and not r.eplb:
        faults.append("spare expert slots without EPLB")
    if engine == "trtllm" and experts != "fp8_block" and r.moe_backend is None:
        faults.append(f"TensorRT-LLM CUTLASS MoE with {experts} experts")
    return faults


def faults_of(engine: str, r: Rendered, spec: ModelSpec, gpu: GpuSpec) -> list[str]:
    return [*slice_faults(r, spec), *path_faults(engine, r, spec, gpu)]


def test_the_plan_space_is_covered() -> None:
    built = plan_space.built()
    engines = {(a.engine, a.layout) for a, _ in built}
    assert engines == {
        (e, layout.name) for e, known in REGISTRY.items() for layout in known.LAYOUTS
    }
    formats = {(a.engine, a.layout, plan_space.weight_formats(a.model)) for a, _ in built}
    assert len(formats) >= 10, formats


def test_every_admitted_plan_renders_splits_that_load_and_kernel_paths_that_exist() -> None:
    faults: list[str] = []
    for a, plan in plan_space.built():
        spec = catalog.model(a.model)
        rendered = servers(plan)
        assert rendered, a.label
        gpu = catalog.gpu(plan.gpu)
        found = [f for r in rendered for f in faults_of(a.engine, r, spec, gpu)]
        faults += [f"{a.label}: {f}" for f in dict.fromkeys(found)]
    assert not faults, "\n".join(faults[:20])


def admitted_nodes() -> dict[tuple[str, str, str, str], list[int]]:
    """(model, GPU, engine, layout) -> the admitted node counts at the model's own context."""
    out: dict[tuple[str, str, str, str], list[int]] = defaultdict(list)
    for a in plan_space.admitted():
        if a.context is None:
            out[(a.model, a.gpu, a.engine, a.layout)].append(a.nodes)
    return out


def test_models_fewest_nodes_are_the_smallest_admitted() -> None:
    admitted = admitted_nodes()
    checked = 0
    for row in rows(tuple(catalog.GPUS)):
        for gpu, figures in row["smallest_nodes"].items():
            for key, figure in figures.items():
                engine, layout = key.split("/")
                counts = admitted.get((row["model"], gpu, engine, layout), [])
                where = f"{row['model']} {gpu} {key}: models says {figure}, admitted {counts}"
                if counts:
                    assert figure == min(counts), where
                    checked += 1
                elif figure != UNSERVED:
                    # Nothing up to 32 nodes: a figure above the enumeration's reach, or none.
                    assert isinstance(figure, str) or figure > plan_space.MAX_NODES, where
    assert checked > 100


def offered(line: str, engine: str, layout: str) -> list[tuple[str, int]]:
    """(layout, nodes) of the single-pool layouts a refusal's fix hints offer."""
    found = []
    same = re.search(rf"{engine} {layout} fits on (.*?)(?:, or |$)", line)
    if same:
        found += [(layout, int(n)) for n in re.findall(r"(\d+) nodes? x \d+ \w+ \(", same[1])]
    others = re.findall(r"k2_layout=(\w+) on (\d+) nodes? \(", line)
    found += [(other, int(n)) for other, n in others]
    return found


def test_plans_outside_the_space_are_refused_with_hints_inside_it() -> None:
    """The gates refuse what build_plan refuses, and the fixes it offers are admitted."""
    admitted = admitted_nodes()
    hints = 0
    for c in plan_space.refused_sample():
        with pytest.raises(PlanError) as info:
            build_plan(c)
        for line in info.value.problems:
            for layout, nodes in offered(line, c.engine, c.layout):
                hints += 1
                if nodes <= plan_space.MAX_NODES:
                    assert nodes in admitted[(c.model, c.gpu, c.engine, layout)], line
    assert hints > 10
