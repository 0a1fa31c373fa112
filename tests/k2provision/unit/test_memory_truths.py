"""Memory counted as the engines spend it, restarts that do not recompile, and the smaller
truths: the DeepEP decode calibration and the reserve per term, plans at the edge of the fit's
own error, FP8 KV only with an attention backend that keeps it FP8, compile caches on a host
volume, one-node vLLM without Ray, and vLLM's data-parallel vision encoder."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from k2provision.core import catalog
from k2provision.core.records import Parallel, Plan
from k2provision.engines import sglang
from k2provision.engines.calibration import calibration_errors_gib, fit_error_gib
from k2provision.plan.assemble import build_plan
from k2provision.plan.containers import LABEL_COMPILE_CACHE, LABEL_HASH, run_argv
from k2provision.plan.fit import kv_headroom_gib
from k2provision.plan.inventory import load_cluster
from k2provision.run.display import reserve_table
from tests.k2provision import plan_rules_memory as rules

ROOT = Path(__file__).resolve().parents[3]


def plan_of(tmp_path: Path, groups: str, **settings: str) -> Plan:
    path = tmp_path / "inventory.ini"
    lines = "".join(f"k2_{k}={v}\n" for k, v in settings.items())
    path.write_text(f"{groups}[all:vars]\n{lines}")
    return build_plan(load_cluster(path))


ONE_NODE = "[nodes]\nn1 ansible_host=10.9.0.1\n"
TWO_NODES = ONE_NODE + "n2 ansible_host=10.9.0.2\n"


def processes(plan: Plan) -> list[tuple[str, ...]]:
    return [p.argv for h in plan.hosts for p in h.processes]


# ---------------------------------------------------------------- 3a: DeepEP decode reserve


def test_the_deepep_decode_scale_reproduces_the_published_measurement() -> None:
    spec = catalog.model("moonshotai/Kimi-K2-Thinking")
    at = Parallel(tp=32, dp=32, ep=32, dp_attention=True)
    graphs, buffers = sglang.deepep_decode_model(spec, at, 128, 256)
    assert graphs + buffers == pytest.approx(9.4, abs=0.05)  # what the model alone counts
    scale = sglang.deepep_decode_scale()
    assert (graphs + buffers) * scale == pytest.approx(sglang.DEEPEP_DECODE_MEASURED_GIB)
    assert "sglang#24453" in sglang.DEEPEP_DECODE_SOURCE


def test_the_plan_shows_every_reserve_term_per_pool_and_names_the_calibration() -> None:
    plan = build_plan(load_cluster(ROOT / "inventory" / "prod.ini"))
    prefill, decode = plan.fit
    assert decode.reserve.all2all > 20
    assert prefill.reserve.all2all == 1.0
    assert decode.reserve.calibration.startswith("CUDA graphs and DeepEP x2.13")
    assert prefill.reserve.calibration == ""
    out = io.StringIO()
    Console(file=out, width=300).print(reserve_table(plan))
    text = " ".join(out.getvalue().split())
    for column in ("CUDA graphs", "collectives", "all2all", "activations", "runtime", "margin"):
        assert column in text
    assert "[decode] calibrated: CUDA graphs and DeepEP x2.13: sgl-project/sglang#24453" in text
    assert f"{decode.reserve.all2all}" in text


def test_the_reserve_rule_catches_a_total_that_is_not_its_terms() -> None:
    plan = build_plan(load_cluster(ROOT / "inventory" / "prod.ini"))
    assert rules.check_reserve_terms(plan) == []
    fit = plan.fit[1].model_copy(update={"reserve_gib": plan.fit[1].reserve_gib + 1})
    broken = plan.model_copy(update={"fit": (plan.fit[0], fit)})
    assert rules.check_reserve_terms(broken)


# ---------------------------------------------------------------- 3b: plans at the edge


def test_the_fit_error_is_derived_from_the_calibration() -> None:
    errors = calibration_errors_gib()
    assert set(errors) == {"vllm-k2-thinking-tp8", "vllm-k2-thinking-tp8-dcp8"}
    assert max(errors.values()) == pytest.approx(1.58, abs=0.01)
    assert fit_error_gib() == 1.6


def test_k2_instruct_at_128k_on_one_h200_node_is_planned_with_a_loud_warning(
    tmp_path: Path,
) -> None:
    plan = plan_of(
        tmp_path,
        ONE_NODE,
        engine="vllm",
        layout="tp",
        gpu="h200",
        model="moonshotai/Kimi-K2-Instruct",
        context_length="131072",
    )
    (report,) = plan.fit
    assert report.fits
    assert 0 < kv_headroom_gib(report) < fit_error_gib()
    (edge,) = [w for w in plan.warnings if "AT THE EDGE" in w]
    assert edge.startswith("[nodes] AT THE EDGE: 0.9 GiB")
    assert "1.6 GiB per GPU" in edge
    assert "fix: add nodes, or lower k2_context_length" in edge
    assert rules.check_edge_warning(plan) == []
    quiet = plan.model_copy(update={"warnings": ()})
    assert rules.check_edge_warning(quiet)


def test_two_nodes_leave_the_edge(tmp_path: Path) -> None:
    plan = plan_of(
        tmp_path,
        TWO_NODES,
        engine="vllm",
        layout="tp",
        gpu="h200",
        model="moonshotai/Kimi-K2-Instruct",
        context_length="131072",
    )
    assert kv_headroom_gib(plan.fit[0]) > fit_error_gib()
    assert not [w for w in plan.warnings if "AT THE EDGE" in w]


# ---------------------------------------------------------------- 3c: FP8 KV on SGLang


@pytest.mark.parametrize(("gpu", "backend"), [("h200", "flashmla"), ("b200", "trtllm_mla")])
def test_sglang_renders_fp8_kv_only_with_a_backend_that_keeps_it_fp8(
    tmp_path: Path, gpu: str, backend: str
) -> None:
    plan = plan_of(tmp_path, TWO_NODES, engine="sglang", layout="tp", gpu=gpu, kv_cache_dtype="fp8")
    for argv in processes(plan):
        i = argv.index("--kv-cache-dtype")
        assert argv[i + 1] == "fp8_e4m3"
        assert argv[argv.index("--attention-backend") + 1] == backend
    assert rules.check_fp8_kv_backend(plan) == []
    bf16 = plan_of(tmp_path, TWO_NODES, engine="sglang", layout="tp", gpu=gpu)
    assert all("--attention-backend" not in a for a in processes(bf16))


def test_the_fp8_rule_catches_the_default_backend(tmp_path: Path) -> None:
    plan = plan_of(tmp_path, TWO_NODES, engine="sglang", layout="tp", kv_cache_dtype="fp8")
    host = plan.hosts[0]
    proc = host.processes[0]
    argv = list(proc.argv)
    del argv[argv.index("--attention-backend") : argv.index("--attention-backend") + 2]
    bad = host.model_copy(update={"processes": (proc.model_copy(update={"argv": tuple(argv)}),)})
    assert rules.check_fp8_kv_backend(plan.model_copy(update={"hosts": (bad,)}))


# ---------------------------------------------------------------- 4: compile caches


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_compile_caches_live_on_a_host_volume_under_the_data_dir(
    tmp_path: Path, engine: str
) -> None:
    plan = plan_of(
        tmp_path, TWO_NODES, engine=engine, layout="tp", model_dir="/data/models/Kimi-K2-Instruct"
    )
    cache = f"/data/models/k2-compile-cache/{engine}"
    assert plan.container.compile_cache == cache
    assert any("compile and JIT caches" in why for why in plan.container.reasons.values())
    host = plan.hosts[0]
    proc = next(p for p in host.processes if p.gpus)
    argv = run_argv(plan.container, proc, plan.config_dir, host.files)
    assert f"{cache}:{cache}" in argv
    assert f"{LABEL_COMPILE_CACHE}={cache}" in argv
    assert f"{cache}/README.k2provision" in host.files
    assert rules.check_compile_caches(plan) == []


def test_k2_compile_cache_dir_moves_the_caches_and_the_container_spec(tmp_path: Path) -> None:
    default = plan_of(tmp_path, ONE_NODE, engine="vllm", layout="tp")
    moved = plan_of(
        tmp_path, ONE_NODE, engine="vllm", layout="tp", compile_cache_dir="/scratch/jit"
    )
    assert moved.container.compile_cache == "/scratch/jit/vllm"
    proc = moved.hosts[0].processes[0]
    assert proc.env["VLLM_CACHE_ROOT"] == "/scratch/jit/vllm"
    assert proc.env["DG_JIT_CACHE_DIR"] == "/scratch/jit/vllm/deep_gemm"
    before = run_argv(
        default.container, default.hosts[0].processes[0], default.config_dir, default.hosts[0].files
    )
    after = run_argv(moved.container, proc, moved.config_dir, moved.hosts[0].files)
    # The spec hash label differs: a moved cache recreates the container.
    assert [a for a in before if a.startswith(LABEL_HASH)] != [
        a for a in after if a.startswith(LABEL_HASH)
    ]
    assert rules.check_compile_caches(moved) == []
    stripped = proc.model_copy(update={"env": {}})
    host = moved.hosts[0].model_copy(update={"processes": (stripped,)})
    assert rules.check_compile_caches(moved.model_copy(update={"hosts": (host,)}))


# ---------------------------------------------------------------- 5: vLLM executor, encoder


def test_one_node_vllm_uses_its_default_executor_and_no_ray(tmp_path: Path) -> None:
    plan = plan_of(tmp_path, ONE_NODE, engine="vllm", layout="tp", context_length="32768")
    (argv,) = processes(plan)
    assert argv[:2] == ("vllm", "serve")
    assert "--distributed-executor-backend" not in argv
    assert plan.hosts[0].processes[0].stage == 0
    assert not plan.hosts[0].processes[0].exec_in
    assert rules.check_vllm_executor(plan) == []
    multi = plan_of(tmp_path, TWO_NODES, engine="vllm", layout="tp")
    assert any(a[:2] == ("ray", "start") for a in processes(multi))
    assert rules.check_vllm_executor(multi) == []


def test_vllm_runs_the_k25_vision_encoder_data_parallel(tmp_path: Path) -> None:
    plan = plan_of(
        tmp_path,
        ONE_NODE,
        engine="vllm",
        layout="tp",
        model="moonshotai/Kimi-K2.5",
        context_length="32768",
    )
    (argv,) = processes(plan)
    assert argv[argv.index("--mm-encoder-tp-mode") + 1] == "data"
    assert rules.check_vllm_encoder(plan) == []
    text = plan_of(
        tmp_path,
        ONE_NODE,
        engine="vllm",
        layout="tp",
        model="moonshotai/Kimi-K2.5",
        context_length="32768",
        multimodal="false",
    )
    (argv,) = processes(text)
    assert "--mm-encoder-tp-mode" not in argv
    assert "--language-model-only" in argv
