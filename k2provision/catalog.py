"""What k2provision knows without asking a host: models, GPUs, and the engine releases it targets.

Model numbers are Kimi-K2's config.json values. A config.json in a local mirror of the
model can override them (`model_from_config`), so a new revision needs no code change.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from k2provision.errors import InventoryError
from k2provision.models import EngineName, EngineRelease, GpuSpec, ModelSpec, RouterRelease

GIB = 1024**3

_KIMI_K2_CONFIG: dict[str, Any] = {
    "architectures": ("DeepseekV3ForCausalLM",),
    "model_type": "kimi_k2",
    "hidden_size": 7168,
    "num_hidden_layers": 61,
    "first_k_dense_replace": 1,
    "num_attention_heads": 64,
    "q_lora_rank": 1536,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "n_routed_experts": 384,
    "num_experts_per_tok": 8,
    "n_shared_experts": 1,
    "moe_intermediate_size": 2048,
    "intermediate_size": 18432,
    "vocab_size": 163840,
    "max_position_embeddings": 131072,
    "weight_block_size": (128, 128),
}

MODELS: dict[str, ModelSpec] = {
    "moonshotai/Kimi-K2-Instruct": ModelSpec(
        id="moonshotai/Kimi-K2-Instruct", checkpoint_gib=959.0, shard_count=61, **_KIMI_K2_CONFIG
    ),
    "moonshotai/Kimi-K2-Base": ModelSpec(
        id="moonshotai/Kimi-K2-Base", checkpoint_gib=959.0, shard_count=61, **_KIMI_K2_CONFIG
    ),
    "moonshotai/Kimi-K2-Instruct-0905": ModelSpec(
        id="moonshotai/Kimi-K2-Instruct-0905",
        checkpoint_gib=959.0,
        shard_count=62,
        **{**_KIMI_K2_CONFIG, "max_position_embeddings": 262144},
    ),
}

GPUS: dict[str, GpuSpec] = {
    "h200": GpuSpec(
        key="h200",
        product_pattern=r"\bH200\b",
        memory_mib=143771,
        fp8=True,
        nvswitch=True,
        min_driver="550.54",
    ),
    "h100": GpuSpec(
        key="h100",
        product_pattern=r"\bH100\b",
        memory_mib=81559,
        fp8=True,
        nvswitch=True,
        min_driver="525.60",
    ),
    "h800": GpuSpec(
        key="h800",
        product_pattern=r"\bH800\b",
        memory_mib=81559,
        fp8=True,
        nvswitch=True,
        min_driver="525.60",
    ),
    "h20": GpuSpec(
        key="h20",
        product_pattern=r"\bH20\b",
        memory_mib=97871,
        fp8=True,
        nvswitch=True,
        min_driver="535.104",
    ),
    "b200": GpuSpec(
        key="b200",
        product_pattern=r"\bB200\b",
        memory_mib=183359,
        fp8=True,
        nvswitch=True,
        min_driver="570.124",
    ),
    "a100": GpuSpec(
        key="a100",
        product_pattern=r"\bA100\b.*80GB",
        memory_mib=81920,
        fp8=False,
        nvswitch=True,
        min_driver="450.80",
    ),
}

# Engine releases and their images. Each image tag names the release it carries; the
# engines' own sources at these releases are what the renders follow (docs/engines.md).
RELEASES: dict[EngineName, EngineRelease] = {
    "sglang": EngineRelease(
        engine="sglang", version="0.5.23", image="lmsysorg/sglang:v0.5.23", min_driver="580.65"
    ),
    "trtllm": EngineRelease(
        engine="trtllm",
        version="1.2.1",
        image="nvcr.io/nvidia/tensorrt-llm/release:1.2.1",
        min_driver="580.65",
    ),
    "vllm": EngineRelease(
        engine="vllm", version="0.33.0", image="vllm/vllm-openai:v0.33.0", min_driver="580.65"
    ),
    # KTransformers serves Kimi-K2 through SGLang with its CPU expert kernels (kt-kernel):
    # kt-kernel 0.7.2 and the SGLang build it pairs with, sglang-kt 0.7.2 (both on PyPI, both
    # pinning torch 2.9.1 and CUDA 12.8 wheels). No public image of this pair is published
    # under a tag we could check, so the image is the one containers/ktransformers builds
    # from those pins.
    "ktransformers": EngineRelease(
        engine="ktransformers",
        version="0.7.2",
        image="localhost/k2provision-ktransformers:0.7.2",
        min_driver="570.26",  # CUDA 12.8, the torch 2.9.1 wheels kt-kernel pins
    ),
}

# The PD router: SGLang's model gateway under its PyPI name sglang-router, whose last
# release is 0.3.2 (the gateway continues as the `smg` package; sglang 0.5.23's own PD tests
# still launch `sglang_router.launch_router`). The sglang wheel does not depend on it, so it
# is pinned here on its own and runs in k2_router_image (containers/router builds one).
ROUTER = RouterRelease(
    package="sglang-router",
    version="0.3.2",
    launcher=("python3", "-m", "sglang_router.launch_router"),
)


def model(model_id: str) -> ModelSpec:
    """Catalog entry for `model_id`, or an InventoryError listing the known ones."""
    try:
        return MODELS[model_id]
    except KeyError:
        known = ", ".join(sorted(MODELS))
        raise InventoryError(
            [
                f"k2_model: unknown model {model_id!r}; expected one of {known}; fix: set k2_model "
                "to a catalog model, or mirror the model locally with its config.json"
            ]
        ) from None


def gpu(key: str) -> GpuSpec:
    """Catalog entry for GPU `key`, or an InventoryError listing the known ones."""
    try:
        return GPUS[key.lower()]
    except KeyError:
        known = ", ".join(sorted(GPUS))
        raise InventoryError(
            [f"k2_gpu: unknown GPU {key!r}; expected one of {known}; fix: set k2_gpu accordingly"]
        ) from None


def model_from_config(base: ModelSpec, config_json: Path) -> ModelSpec:
    """`base` with architecture numbers replaced by those of a local config.json."""
    try:
        raw = json.loads(config_json.read_text())
    except (OSError, ValueError) as exc:
        raise InventoryError(
            [
                f"k2_model_config_json={config_json}: cannot read a config.json there "
                f"({exc}); fix: point it at the model's config.json on the controller, "
                "or unset it"
            ]
        ) from None
    fields = set(_KIMI_K2_CONFIG) - {"weight_block_size", "architectures"}
    update: dict[str, Any] = {k: raw[k] for k in fields if k in raw}
    if "architectures" in raw:
        update["architectures"] = tuple(raw["architectures"])
    block = raw.get("quantization_config", {}).get("weight_block_size")
    if block:
        update["weight_block_size"] = tuple(block)
    return base.model_copy(update=update)


# ---------------------------------------------------------------- derived model sizes


def kv_bytes_per_token_per_layer(spec: ModelSpec, dtype_bytes: int = 2) -> int:
    """MLA caches one compressed latent plus the rope key per token and layer."""
    return (spec.kv_lora_rank + spec.qk_rope_head_dim) * dtype_bytes


def _fp8_bytes(params: int, spec: ModelSpec) -> float:
    """FP8 weights plus one float32 scale per weight block."""
    block = spec.weight_block_size[0] * spec.weight_block_size[1]
    return params * (1 + 4 / block)


def routed_expert_params_per_layer(spec: ModelSpec) -> int:
    """Parameters of one routed expert in one MoE layer (gate, up and down projections)."""
    return 3 * spec.hidden_size * spec.moe_intermediate_size


def moe_layers(spec: ModelSpec) -> int:
    """Number of layers whose MLP is a mixture of experts."""
    return spec.num_hidden_layers - spec.first_k_dense_replace


def routed_expert_bytes(spec: ModelSpec) -> float:
    """Bytes of all routed experts over all MoE layers (FP8 with block scales)."""
    params = routed_expert_params_per_layer(spec) * spec.n_routed_experts * moe_layers(spec)
    return _fp8_bytes(params, spec)


def one_expert_all_layers_bytes(spec: ModelSpec) -> float:
    """Bytes that one extra (redundant) expert slot costs a GPU: one expert in every MoE layer."""
    return _fp8_bytes(routed_expert_params_per_layer(spec) * moe_layers(spec), spec)


def attention_params(spec: ModelSpec) -> int:
    """Parameters of the MLA attention projections over all layers."""
    h = spec.hidden_size
    heads = spec.num_attention_heads
    per_layer = (
        h * spec.q_lora_rank
        + spec.q_lora_rank * heads * (spec.qk_nope_head_dim + spec.qk_rope_head_dim)
        + h * (spec.kv_lora_rank + spec.qk_rope_head_dim)
        + spec.kv_lora_rank * heads * (spec.qk_nope_head_dim + spec.v_head_dim)
        + heads * spec.v_head_dim * h
    )
    return per_layer * spec.num_hidden_layers


def dense_bytes(spec: ModelSpec) -> float:
    """Bytes of everything that is not a routed expert: attention, dense MLPs, shared experts,
    router gates (FP8) and the embedding and LM head (BF16)."""
    h = spec.hidden_size
    attn = attention_params(spec)
    dense_mlp = 3 * h * spec.intermediate_size * spec.first_k_dense_replace
    shared = routed_expert_params_per_layer(spec) * spec.n_shared_experts * moe_layers(spec)
    gates = spec.n_routed_experts * h * moe_layers(spec)
    embeddings = 2 * spec.vocab_size * h * 2
    return _fp8_bytes(attn + dense_mlp + shared + gates, spec) + embeddings


def total_params(spec: ModelSpec) -> int:
    """Approximate parameter count (about 1.03e12 for Kimi-K2)."""
    h = spec.hidden_size
    attn = attention_params(spec)
    experts = (
        routed_expert_params_per_layer(spec)
        * (spec.n_routed_experts + spec.n_shared_experts)
        * moe_layers(spec)
    )
    return (
        attn
        + experts
        + 3 * h * spec.intermediate_size * spec.first_k_dense_replace
        + spec.n_routed_experts * h * moe_layers(spec)
        + 2 * spec.vocab_size * h
    )
