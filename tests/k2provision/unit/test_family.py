"""The Kimi-K2 family through the planner: smallest layouts, engine releases, per-model flags."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from k2provision.core import catalog
from k2provision.core.records import EngineRelease, Plan
from k2provision.engines import REGISTRY
from k2provision.errors import K2Error, PlanError
from k2provision.plan.assemble import build_plan
from k2provision.plan.inventory import load_cluster
from k2provision.plan.support import support_problems

THINKING = "moonshotai/Kimi-K2-Thinking"
K25 = "moonshotai/Kimi-K2.5"
INT4_FAMILY = (THINKING, K25, "moonshotai/Kimi-K2.6", "moonshotai/Kimi-K2.7-Code")


def inventory(
    tmp_path: Path, n: int, engine: str, layout: str, model: str, extra: str = ""
) -> Path:
    hosts = "".join(f"n{i} ansible_host=10.9.0.{i}\n" for i in range(1, n + 1))
    path = tmp_path / f"{engine}-{layout}-{n}.ini"
    path.write_text(
        f"[nodes]\n{hosts}[all:vars]\nk2_engine={engine}\nk2_layout={layout}\n"
        f"k2_model={model}\n{extra}"
    )
    return path


def plan_of(tmp_path: Path, n: int, engine: str, layout: str, model: str, extra: str = "") -> Plan:
    return build_plan(load_cluster(inventory(tmp_path, n, engine, layout, model, extra)))


def serve_argv(plan: Plan) -> tuple[str, ...]:
    return next(
        p.argv
        for h in plan.hosts
        for p in h.processes
        if p.argv[:2] == ("vllm", "serve") or "sglang.launch_server" in p.argv
    )


@pytest.mark.parametrize("model", INT4_FAMILY)
@pytest.mark.parametrize(
    ("engine", "layout"), [("sglang", "tp"), ("vllm", "tp"), ("vllm", "dp_ep")]
)
def test_int4_family_plans_on_one_8xh200_node(
    tmp_path: Path, model: str, engine: str, layout: str
) -> None:
    plan = plan_of(tmp_path, 1, engine, layout, model)
    (fit,) = plan.fit
    assert fit.fits
    assert fit.context_length == 262144
    assert plan.pools[0].gpus == 8
    assert plan.weights.checkpoint_gib == catalog.model(model).checkpoint_gib


@pytest.mark.parametrize("model", INT4_FAMILY)
@pytest.mark.parametrize(("engine", "layout"), [("sglang", "tp"), ("vllm", "tp")])
def test_int4_family_is_refused_on_one_8xh100_node_naming_16_gpus(
    tmp_path: Path, model: str, engine: str, layout: str
) -> None:
    with pytest.raises(PlanError, match="fits on 2 nodes x 8 h100") as info:
        plan_of(tmp_path, 1, engine, layout, model, "k2_gpu=h100\n")
    (line,) = info.value.problems
    assert f"{engine} {layout} fits on 2 nodes x 8 h100" in line
    assert "16 GPUs" in line
    # The weights and reserve alone exceed an H100: no shorter context is offered.
    assert "k2_context_length" not in line


def test_every_layout_is_searched_for_a_fix(tmp_path: Path) -> None:
    with pytest.raises(PlanError, match="k2_layout=tp_pp on 2 nodes") as info:
        plan_of(tmp_path, 1, "vllm", "tp", THINKING, "k2_gpu=h100\n")
    line = info.value.problems[0]
    assert "k2_layout=tp_pp on 2 nodes" in line
    assert "k2_layout=dp_ep on 3 nodes" in line


def test_tensorrt_llm_refuses_the_int4_family_and_ktransformers_reads_it_raw(
    tmp_path: Path,
) -> None:
    inv = tmp_path / "t.ini"
    inv.write_text(
        "[nodes]\na ansible_host=10.9.0.1\nb ansible_host=10.9.0.2\n[all:vars]\n"
        f"k2_engine=trtllm\nk2_layout=tp_ep\nk2_model={THINKING}\n"
    )
    with pytest.raises(PlanError, match="no trtllm release is known to serve it") as info:
        build_plan(load_cluster(inv))
    (line,) = info.value.problems
    assert "no trtllm release is known to serve it" in line
    assert "NVFP4" in line
    assert "fix: choose k2_engine=sglang or vllm" in line
    # kt-kernel reads the native INT4 experts as they are (--kt-method RAWINT4).
    plan = plan_of(tmp_path, 1, "ktransformers", "single", K25)
    (proc,) = plan.hosts[0].processes
    assert proc.argv[proc.argv.index("--kt-method") + 1] == "RAWINT4"
    fp8 = plan_of(tmp_path, 1, "ktransformers", "single", "moonshotai/Kimi-K2-Instruct")
    (proc,) = fp8.hosts[0].processes
    assert proc.argv[proc.argv.index("--kt-method") + 1] == "FP8"


def test_an_older_release_is_refused_naming_what_it_needs_and_k2_image() -> None:
    spec = catalog.model("moonshotai/Kimi-K2.6")
    old = EngineRelease(
        engine="vllm", version="0.24.1", image="vllm/vllm-openai:v0.24.1", min_driver="1"
    )
    problems, warnings = support_problems(spec, "vllm", old, None)
    (line,) = problems
    assert "needs vllm >= 0.25.0" in line
    assert "the pinned release is 0.24.1" in line
    assert "k2_image" in line
    assert warnings == []
    problems, warnings = support_problems(spec, "vllm", old, "registry/vllm:custom")
    assert problems == []
    assert "k2_image=registry/vllm:custom" in warnings[0]
    pinned = REGISTRY["vllm"].RELEASE
    assert support_problems(spec, "vllm", pinned, None) == ([], [])


def test_a_k3_model_is_refused_as_not_a_k2_variant(tmp_path: Path) -> None:
    with pytest.raises(K2Error, match="not a Kimi-K2 variant"):
        plan_of(tmp_path, 1, "vllm", "tp", "moonshotai/Kimi-K3")


def test_parsers_and_multimodal_facts_live_on_the_model() -> None:
    assert catalog.model(THINKING).reasoning_parser == "kimi_k2"
    assert catalog.model(K25).reasoning_parser == "kimi_k2"
    assert catalog.model("moonshotai/Kimi-K2-Instruct").reasoning_parser is None
    assert all(s.tool_parser == "kimi_k2" for s in catalog.MODELS.values())
    assert catalog.model(K25).multimodal
    assert not catalog.model(THINKING).multimodal
    assert "*.py" in catalog.model(K25).allow_patterns
    assert "*.jinja" in catalog.model(K25).allow_patterns


def test_text_only_k25_on_vllm_drops_the_vision_tower(tmp_path: Path) -> None:
    multimodal = plan_of(tmp_path, 1, "vllm", "tp", K25)
    text = plan_of(tmp_path, 1, "vllm", "tp", K25, "k2_multimodal=false\n")
    assert "--language-model-only" not in serve_argv(multimodal)
    assert "--language-model-only" in serve_argv(text)
    assert multimodal.fit[0].vision_gib > 0.5
    assert text.fit[0].vision_gib == 0
    assert text.fit[0].kv_tokens_per_gpu > multimodal.fit[0].kv_tokens_per_gpu


def test_sglang_keeps_the_vision_tower_and_says_so(tmp_path: Path) -> None:
    plan = plan_of(tmp_path, 1, "sglang", "tp", K25, "k2_multimodal=false\n")
    assert "--language-model-only" not in serve_argv(plan)
    assert plan.fit[0].vision_gib > 0.5
    assert any("no text-only mode" in w for w in plan.warnings)


def test_multimodal_on_a_text_model_is_refused(tmp_path: Path) -> None:
    with pytest.raises(PlanError, match="k2_multimodal=true: moonshotai/Kimi-K2-Thinking"):
        plan_of(tmp_path, 1, "vllm", "tp", THINKING, "k2_multimodal=true\n")


@pytest.mark.parametrize(("engine", "flag"), [("vllm", "fp8"), ("sglang", "fp8_e4m3")])
def test_fp8_kv_cache_is_rendered_and_counted(tmp_path: Path, engine: str, flag: str) -> None:
    bf16 = plan_of(tmp_path, 1, engine, "tp", THINKING)
    fp8 = plan_of(tmp_path, 1, engine, "tp", THINKING, "k2_kv_cache_dtype=fp8\n")
    argv = serve_argv(fp8)
    assert argv[argv.index("--kv-cache-dtype") + 1] == flag
    assert "--kv-cache-dtype" not in serve_argv(bf16)
    assert fp8.fit[0].kv_dtype == "fp8"
    assert fp8.fit[0].kv_tokens_per_gpu > 1.9 * bf16.fit[0].kv_tokens_per_gpu


def test_fp4_checkpoints_need_blackwell(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text(
        json.dumps(
            {
                "architectures": ["DeepseekV3ForCausalLM"],
                "model_type": "kimi_k2",
                "torch_dtype": "bfloat16",
                "quantization_config": {
                    "quant_method": "modelopt",
                    "quant_algo": "NVFP4",
                    "group_size": 16,
                    "exclude_modules": ["*self_attn*", "lm_head"],
                },
            }
        )
    )
    extra = f"k2_model_config_json={config}\n"
    with pytest.raises(PlanError, match=r"ships FP4 .* fix: use Blackwell GPUs"):
        plan_of(tmp_path, 1, "vllm", "tp", THINKING, extra)
    plan = plan_of(tmp_path, 1, "vllm", "tp", THINKING, extra + "k2_gpu=b200\n")
    assert plan.weights.checkpoint_gib < catalog.model(THINKING).checkpoint_gib


def test_the_plan_exposes_the_checkpoint_the_weights_phase_moves(tmp_path: Path) -> None:
    plan = plan_of(tmp_path, 1, "vllm", "tp", K25)
    assert plan.weights.shard_count == 64
    assert plan.weights.checkpoint_gib == 554.3
    assert "*.safetensors" in plan.weights.allow_patterns
    dumped = plan.model_dump(mode="json")
    assert dumped["weights"]["allow_patterns"] == list(plan.weights.allow_patterns)
