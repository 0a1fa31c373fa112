"""The checkers against the pinned engines' real parsers.

Needs the venvs from scripts/install-engine-parsers; without them these tests
fail (ParsersNotInstalled), they are not skipped.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from .runner import HERE, ParsersNotInstalled, check, venv_python

pytestmark = pytest.mark.parsers

MODEL = "/models/Kimi-K2-Instruct"
SGLANG = ["python", "-m", "sglang.launch_server"]
ROUTER = ["python", "-m", "sglang_router.launch_router"]
VLLM = ["vllm", "serve"]
IB = "mlx5_0,mlx5_1,mlx5_2,mlx5_3,mlx5_4,mlx5_5,mlx5_6,mlx5_7"

SGLANG_TP16 = [
    *SGLANG,
    "--model-path", MODEL,
    "--tp-size", "16",
    "--dist-init-addr", "10.0.0.1:50000",
    "--nnodes", "2",
    "--node-rank", "0",
    "--trust-remote-code",
    "--tool-call-parser", "kimi_k2",
    "--host", "0.0.0.0",
    "--port", "30000",
]  # fmt: skip

# The seed's 4P12D decode command in its modern spelling.
SGLANG_DECODE = [
    *SGLANG,
    "--model-path", MODEL,
    "--trust-remote-code",
    "--disaggregation-mode", "decode",
    "--dist-init-addr", "10.0.2.1:5757",
    "--tp-size", "96",
    "--attn-dp-size", "96",
    "--host", "10.0.2.1",
    "--decode-log-interval", "1",
    "--context-length", "2176",
    "--disable-radix-cache",
    "--moe-a2a-backend", "deepep",
    "--moe-dense-tp-size", "1",
    "--enable-dp-lm-head",
    "--disable-shared-experts-fusion",
    "--watchdog-timeout", "1000000",
    "--enable-two-batch-overlap",
    "--disaggregation-ib-device", IB,
    "--deepep-mode", "low_latency",
    "--mem-fraction-static", "0.8",
    "--cuda-graph-bs-decode", "480",
    "--max-running-requests", "46080",
    "--ep-num-redundant-experts", "96",
    "--nnodes", "12",
    "--node-rank", "0",
    "--tool-call-parser", "kimi_k2",
]  # fmt: skip

DECODE_ENV = {
    "SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK": "480",
    "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT": "300",
}

VLLM_DP_HEAD = [
    *VLLM, MODEL,
    "--port", "8000",
    "--served-model-name", "kimi-k2",
    "--trust-remote-code",
    "--data-parallel-size", "16",
    "--data-parallel-size-local", "8",
    "--data-parallel-address", "10.0.0.1",
    "--data-parallel-rpc-port", "13345",
    "--enable-expert-parallel",
    "--max-num-batched-tokens", "8192",
    "--max-num-seqs", "256",
    "--gpu-memory-utilization", "0.85",
    "--enable-auto-tool-choice",
    "--tool-call-parser", "kimi_k2",
]  # fmt: skip


# ---- SGLang -------------------------------------------------------------------


def test_sglang_tp16_parses_and_resolves() -> None:
    result = check("sglang", SGLANG_TP16)
    assert result.ok, result.error
    assert result.version == "0.5.23"
    assert result.parsed["tp_size"] == 16
    assert result.parsed["nnodes"] == 2
    assert result.parsed["dist_init_addr"] == "10.0.0.1:50000"
    assert result.parsed["tool_call_parser"] == "kimi_k2"
    assert result.resolved["tp_size"] == 16
    assert result.warnings == []


def test_sglang_modern_decode_resolves_to_attention_dp_and_deepep() -> None:
    result = check("sglang", SGLANG_DECODE, DECODE_ENV)
    assert result.ok, result.error
    assert result.value("attn_dp_size") == 96
    assert result.value("dp_size") == 1
    assert result.value("ep_size") == 96  # DeepEP forces ep_size == tp_size
    assert result.value("moe_a2a_backend") == "deepep"
    assert result.value("cuda_graph_bs_decode") == [480]
    assert not result.warned("deprecated")


def test_sglang_rejects_stale_enable_deepep_moe() -> None:
    argv = [*SGLANG_TP16, "--enable-deepep-moe"]
    result = check("sglang", argv)
    assert not result.ok
    assert result.stage == "parse"
    assert "--enable-deepep-moe" in result.error


def test_sglang_rejects_ambiguous_cuda_graph_bs() -> None:
    result = check("sglang", [*SGLANG_TP16, "--cuda-graph-bs", "480"])
    assert not result.ok
    assert "ambiguous option: --cuda-graph-bs" in result.error


def test_sglang_warns_on_deprecated_enable_dp_attention() -> None:
    argv = [*SGLANG_TP16[:5], "--dp-size", "16", "--enable-dp-attention", *SGLANG_TP16[5:]]
    result = check("sglang", argv)
    assert result.ok, result.error
    assert result.warned("'--enable-dp-attention' is deprecated")
    assert result.value("attn_dp_size") == 16


def test_sglang_resolution_rejects_replicas_with_attention_dp() -> None:
    argv = [*SGLANG_TP16, "--attn-dp-size", "16", "--dp-size", "16"]
    result = check("sglang", argv)
    assert not result.ok
    assert result.stage == "resolve"
    assert "--attn-dp-size" in result.error


def test_sglang_parse_only_option() -> None:
    argv = [*SGLANG_TP16, "--context-length", "262144"]  # rejected only by resolution
    result = check("sglang", argv, options={"resolve": False})
    assert result.ok, result.error
    assert result.resolved == {}


# ---- sglang-router ------------------------------------------------------------


def test_router_pd_launch_parses_offline() -> None:
    argv = [
        *ROUTER,
        "--pd-disaggregation",
        "--prefill", "http://10.0.1.1:30000", "8998",
        "--decode", "http://10.0.2.1:30000",
        "--prefill-policy", "cache_aware",
        "--decode-policy", "round_robin",
        "--host", "0.0.0.0",
        "--port", "8000",
    ]  # fmt: skip
    result = check("sglang-router", argv)
    assert result.ok, result.error
    assert result.parsed["pd_disaggregation"] is True
    assert result.parsed["prefill_urls"] == [["http://10.0.1.1:30000", 8998]]
    assert result.parsed["decode_urls"] == ["http://10.0.2.1:30000"]


def test_router_rejects_bad_bootstrap_port() -> None:
    argv = [
        *ROUTER,
        "--pd-disaggregation",
        "--prefill",
        "http://p:30000",
        "x",
        "--decode",
        "http://d:30000",
    ]
    result = check("sglang-router", argv)
    assert not result.ok
    assert "Invalid bootstrap port: x" in result.error


def test_router_validation_refuses_power_of_two_for_one_decode_worker() -> None:
    """The router's own configuration rules, as its start checks them: the command line that
    parses and builds, but that sglang-router 0.3.2 refuses to start."""
    argv = [
        *ROUTER,
        "--pd-disaggregation",
        "--prefill", "http://10.0.1.1:30000", "8998",
        "--prefill", "http://10.0.1.2:30000", "8998",
        "--decode", "http://10.0.2.1:30000",
        "--policy", "cache_aware",
        "--decode-policy", "power_of_two",
        "--host", "0.0.0.0",
        "--port", "8000",
    ]  # fmt: skip
    result = check("sglang-router", argv)
    assert not result.ok
    assert result.stage == "validate"
    assert "Power-of-two policy for decode requires at least 2 decode workers" in result.error
    built = check("sglang-router", argv, options={"validate": False})
    assert built.ok, built.error
    argv.insert(argv.index("--decode") + 2, "--decode")
    argv.insert(argv.index("--decode") + 3, "http://10.0.2.2:30000")
    assert check("sglang-router", argv).ok


# ---- vLLM ---------------------------------------------------------------------


def test_vllm_dp_ep_head_parses() -> None:
    result = check("vllm", VLLM_DP_HEAD)
    assert result.ok, result.error
    assert result.version == "0.33.0"
    assert result.parsed["model"] == MODEL
    assert result.parsed["data_parallel_size"] == 16
    assert result.parsed["data_parallel_size_local"] == 8
    assert result.parsed["enable_expert_parallel"] is True
    assert result.value("served_model_name") == ["kimi-k2"]


def test_vllm_tp16_ray_engine_config() -> None:
    argv = [*VLLM, MODEL, "--tensor-parallel-size", "16", "--distributed-executor-backend", "ray"]
    result = check("vllm", argv, options={"engine_config": True})
    assert result.ok, result.error
    assert result.value("tensor_parallel_size") == 16


def test_vllm_rejects_made_up_flag() -> None:
    result = check("vllm", [*VLLM_DP_HEAD, "--enable-kimi-turbo"])
    assert not result.ok
    assert result.stage == "parse"
    assert "--enable-kimi-turbo" in result.error


def test_vllm_rejects_unknown_tool_parser() -> None:
    argv = [*VLLM, MODEL, "--enable-auto-tool-choice", "--tool-call-parser", "kimi"]
    result = check("vllm", argv)
    assert not result.ok
    assert "invalid tool call parser: kimi" in result.error


# ---- plumbing -----------------------------------------------------------------


def test_missing_venv_fails_with_install_hint(tmp_path: Path) -> None:
    with pytest.raises(ParsersNotInstalled, match="run scripts/install-engine-parsers"):
        check("sglang", SGLANG_TP16, root=tmp_path)


def test_checker_reports_bad_launcher_as_internal_failure() -> None:
    python = venv_python("sglang")
    proc = subprocess.run(
        [str(python), str(HERE / "check_sglang.py")],
        input=json.dumps({"argv": ["vllm", "serve", MODEL]}),
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert proc.returncode == 2
    data = json.loads(proc.stdout)
    assert data["internal"] is True
    assert "argv must start with" in data["error"]
