"""The strict mirror of TensorRT-LLM's TorchLlmArgs: stale, misspelled and mistyped keys fail."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from k2provision.engines import REGISTRY
from k2provision.engines import trtllm_schema as schema
from k2provision.engines.trtllm_schema import (
    RENAMED,
    TRTLLM_VERSION,
    UNMODELED,
    ExtraLlmApiOptions,
    TrtllmOptionsError,
    validate_extra_llm_api_options,
)
from k2provision.errors import K2Error

# The extra-llm-api-config.yml of seed 001, verbatim.
SEED_YAML = """\
cuda_graph_config:
  padding_enabled: true
  batch_sizes:
    - 1
    - 2
    - 4
    - 8
    - 16
    - 32
    - 64
    - 128
print_iter_log: true
enable_attention_dp: true
"""


def problems(data: Any) -> tuple[str, ...]:
    with pytest.raises(TrtllmOptionsError) as info:
        validate_extra_llm_api_options(data)
    return info.value.problems


def test_mirrors_the_pinned_release() -> None:
    assert REGISTRY["trtllm"].RELEASE.version == TRTLLM_VERSION


def test_seed_yaml_fails_naming_the_old_and_the_new_key() -> None:
    found = problems(yaml.safe_load(SEED_YAML))
    assert len(found) == 1
    line = found[0]
    assert line.startswith("cuda_graph_config.padding_enabled: unknown key in TensorRT-LLM 1.2.1")
    assert "renamed enable_padding" in line
    assert "fix:" in line


def test_seed_yaml_passes_once_the_key_is_renamed() -> None:
    fixed = yaml.safe_load(SEED_YAML.replace("padding_enabled", "enable_padding"))
    options = validate_extra_llm_api_options(fixed)
    assert options.cuda_graph_config is not None
    assert options.cuda_graph_config.enable_padding is True
    assert options.cuda_graph_config.batch_sizes == [1, 2, 4, 8, 16, 32, 64, 128]
    assert options.enable_attention_dp is True


def _nest(path: str, value: object) -> dict[str, Any]:
    head, _, rest = path.partition(".")
    return {head: _nest(rest, value) if rest else value}


@pytest.mark.parametrize("path", sorted(RENAMED))
def test_every_known_rename_is_explained(path: str) -> None:
    found = problems(_nest(path, True))
    assert len(found) == 1
    what, _ = RENAMED[path]
    assert found[0].startswith(f"{path}: unknown key in TensorRT-LLM {TRTLLM_VERSION}; it was")
    assert what in found[0]


@pytest.mark.parametrize("path", sorted(RENAMED))
def test_every_rename_points_to_a_field_that_exists(path: str) -> None:
    what, _ = RENAMED[path]
    target = what.split()[-1]
    if what.startswith("renamed") and "." in path:
        target = f"{path.rsplit('.', 1)[0]}.{target}"
    *parents, leaf = target.split(".")
    model: type[BaseModel] = ExtraLlmApiOptions
    for part in parents:
        model = schema._model_types(model.model_fields[part].annotation)[0]
    assert leaf in model.model_fields, (path, target)


def test_unknown_top_level_key_is_rejected_with_a_hint() -> None:
    found = problems({"enable_atention_dp": True})
    assert found == (
        "enable_atention_dp: unknown key in TensorRT-LLM 1.2.1; fix: did you mean "
        "enable_attention_dp? remove it or use a key of llm_args.py's TorchLlmArgs",
    )


def test_unknown_nested_key_is_rejected() -> None:
    (line,) = problems({"kv_cache_config": {"free_gpu_mem_fraction": 0.9}})
    assert line.startswith("kv_cache_config.free_gpu_mem_fraction: unknown key")
    assert "did you mean free_gpu_memory_fraction?" in line


def test_unknown_key_inside_speculative_config_names_the_right_path() -> None:
    (line,) = problems(
        {"speculative_config": {"decoding_type": "MTP", "num_nextn_predict_layer": 1}}
    )
    assert line.startswith("speculative_config.num_nextn_predict_layer: unknown key")
    assert "did you mean num_nextn_predict_layers?" in line


@pytest.mark.parametrize("key", sorted(UNMODELED))
def test_unmodeled_engine_keys_are_refused_with_their_reason(key: str) -> None:
    (line,) = problems({key: {}})
    assert line.startswith(f"{key}: a TensorRT-LLM 1.2.1 key that k2provision does not model")


def test_every_problem_is_reported_at_once() -> None:
    found = problems({"use_cuda_graph": True, "kv_cache_dtype": "fp8", "bogus": 1})
    assert [line.split(":")[0] for line in found] == ["use_cuda_graph", "kv_cache_dtype", "bogus"]


@pytest.mark.parametrize(
    ("data", "path", "fix"),
    [
        (
            {"kv_cache_config": {"free_gpu_memory_fraction": 1.5}},
            "kv_cache_config.free_gpu_memory_fraction",
            "within the bound",
        ),
        ({"kv_cache_config": {"dtype": "int8"}}, "kv_cache_config.dtype", "one of the values"),
        (
            {"cache_transceiver_config": {"backend": "ucx"}},
            "cache_transceiver_config.backend",
            "one of the values",
        ),
        ({"moe_config": {"backend": "DEEPEP"}}, "moe_config.backend", "one of the values"),
        ({"stream_interval": 0}, "stream_interval", "within the bound"),
        (
            {"cuda_graph_config": {"batch_sizes": [1, 2], "max_batch_size": 4}},
            "cuda_graph_config",
            "consistent",
        ),
        (
            {"speculative_config": {"decoding_type": "Medusa"}},
            "speculative_config",
            "one of the values",
        ),
    ],
)
def test_bad_values_name_the_key_and_the_fix(data: dict[str, Any], path: str, fix: str) -> None:
    (line,) = problems(data)
    assert line.startswith(f"{path}: ")
    assert fix in line


def test_top_level_must_be_a_mapping() -> None:
    (line,) = problems(["enable_attention_dp"])
    assert "expected a mapping" in line


def test_error_is_a_k2_error() -> None:
    assert issubclass(TrtllmOptionsError, K2Error)


def test_a_full_disaggregation_style_config_validates() -> None:
    data = yaml.safe_load(
        """
        enable_attention_dp: true
        attention_dp_config: {enable_balance: true, batching_wait_iters: 0, timeout_iters: 60}
        disable_overlap_scheduler: true
        stream_interval: 10
        max_batch_size: 256
        max_num_tokens: 8192
        enable_chunked_prefill: true
        trust_remote_code: true
        tensor_parallel_size: 16
        moe_expert_parallel_size: 16
        moe_config: {backend: WIDEEP, max_num_tokens: 16384}
        kv_cache_config: {free_gpu_memory_fraction: 0.85, dtype: fp8, enable_block_reuse: false}
        cache_transceiver_config: {backend: UCX, max_tokens_in_buffer: 8448}
        cuda_graph_config: {enable_padding: true, max_batch_size: 256}
        speculative_config: {decoding_type: MTP, num_nextn_predict_layers: 3}
        print_iter_log: false
        """
    )
    options = validate_extra_llm_api_options(data)
    assert options.cache_transceiver_config is not None
    assert options.cache_transceiver_config.backend == "UCX"
    assert options.moe_config.backend == "WIDEEP"


def test_speculative_model_dir_is_accepted_as_an_alias() -> None:
    options = validate_extra_llm_api_options(
        {
            "speculative_config": {
                "decoding_type": "Eagle3",
                "max_draft_len": 3,
                "speculative_model_dir": "/models/draft",
            }
        }
    )
    assert options.speculative_config is not None
    assert options.speculative_config.speculative_model == "/models/draft"


def test_cuda_graphs_can_be_switched_off_with_null() -> None:
    assert validate_extra_llm_api_options({"cuda_graph_config": None}).cuda_graph_config is None


def test_defaults_mirror_the_source() -> None:
    options = ExtraLlmApiOptions()
    assert options.max_batch_size == 2048
    assert options.max_num_tokens == 8192
    assert options.print_iter_log is False
    assert options.enable_attention_dp is False
    assert options.stream_interval == 1
    assert options.disable_overlap_scheduler is False
    assert options.moe_config.backend == "AUTO"
    assert options.kv_cache_config.free_gpu_memory_fraction == 0.9
    assert options.kv_cache_config.enable_block_reuse is True
    assert options.kv_cache_config.dtype == "auto"
    assert options.kv_cache_config.tokens_per_block == 32
    assert options.cuda_graph_config is not None
    assert options.cuda_graph_config.enable_padding is False
    assert options.cuda_graph_config.max_batch_size == 0
    assert options.scheduler_config.capacity_scheduler_policy == "GUARANTEED_NO_EVICT"
    assert schema.CacheTransceiverConfig().kv_transfer_sender_future_timeout_ms == 1000
    assert schema.AttentionDpConfig().timeout_iters == 50
