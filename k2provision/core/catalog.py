"""What k2provision knows without asking a host: models, GPUs, and the engine releases it targets.

Model numbers are the models' own config.json values (sources on each entry). A config.json
in a local mirror of the model can override them (`model_from_config`), so a new revision
needs no code change. Weight sizes are computed per weight class from the quantization the
config declares, never assumed to be FP8.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from k2provision.core import bounded_read
from k2provision.core.model_config import ConfigProblems, load_config_json, spec_from_config
from k2provision.core.records import (
    GpuSpec,
    ModelSpec,
    Quantization,
    RouterRelease,
    VisionSpec,
    WeightFormat,
)
from k2provision.errors import InventoryError

GIB = 1024**3

# ---------------------------------------------------------------- weight formats

BF16 = WeightFormat(scheme="bf16", bits=16)
# DeepSeek-V3 FP8: e4m3 weights, one float32 scale per 128x128 block.
FP8_BLOCK_128 = WeightFormat(scheme="fp8_block", bits=8, group_size=128 * 128, scale_bytes=4)
# compressed-tensors pack-quantized INT4: eight values per int32, one BF16 scale per 32.
INT4_G32 = WeightFormat(scheme="int4_group", bits=4, group_size=32, scale_bytes=2)

FP8_EVERYWHERE = Quantization(
    routed_experts=FP8_BLOCK_128,
    attention=FP8_BLOCK_128,
    shared_experts=FP8_BLOCK_128,
    dense_mlp=FP8_BLOCK_128,
    source="quantization_config",
)
# Routed experts INT4; attention, shared experts and the dense layer stay BF16 (the config's
# ignore list: "re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\.(gate|up|...)_proj.*").
INT4_EXPERTS = Quantization(
    routed_experts=INT4_G32,
    attention=BF16,
    shared_experts=BF16,
    dense_mlp=BF16,
    source="quantization_config",
)

# ---------------------------------------------------------------- models

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
}

# MoonViT of Kimi-K2.5 and later (config.json vision_config: vt_* fields).
MOONVIT = VisionSpec(hidden_size=1152, num_hidden_layers=27, intermediate_size=4304, patch_size=14)

RECIPES = "vllm-project/recipes models/moonshotai"
# What a multimodal Kimi checkpoint carries besides the text model's files: the MoonViT
# processor's code and configs (kimi_k25_processor.py, media_utils.py,
# preprocessor_config.json), which the text model's patterns already match, and the docs the
# model card links.
_MULTIMODAL_PATTERNS = (*ModelSpec.model_fields["allow_patterns"].default, "*.md")


def _k25_family(model_id: str, note: str) -> ModelSpec:
    return ModelSpec(
        id=model_id,
        **{
            **_KIMI_K2_CONFIG,
            "architectures": ("KimiK25ForConditionalGeneration",),
            "model_type": "kimi_k25",
            "max_position_embeddings": 262144,
        },
        quantization=INT4_EXPERTS.model_copy(update={"source": "text_config.quantization_config"}),
        vision=MOONVIT,
        checkpoint_gib=554.3,
        shard_count=64,
        allow_patterns=_MULTIMODAL_PATTERNS,
        reasoning_parser="kimi_k2",
        decode_context_parallel=True,
        sources=(
            f"https://huggingface.co/{model_id} config.json: KimiK25ForConditionalGeneration, "
            "text_config (DeepSeek-V3 numbers, max_position_embeddings 262144) and its "
            "compressed-tensors INT4 group-32 quantization_config, vision_config MoonViT 27 x 1152",
            "64 shards model-000NN-of-000064.safetensors, 554.3 GiB (about 595 GB)",
            note,
        ),
    )


def _k2_fp8(model_id: str, shards: int, context: int, *sources: str) -> ModelSpec:
    return ModelSpec(
        id=model_id,
        **{**_KIMI_K2_CONFIG, "max_position_embeddings": context},
        quantization=FP8_EVERYWHERE,
        checkpoint_gib=959.0,
        shard_count=shards,
        decode_context_parallel=True,
        sources=sources,
    )


MODELS: dict[str, ModelSpec] = {
    "moonshotai/Kimi-K2-Instruct": _k2_fp8(
        "moonshotai/Kimi-K2-Instruct",
        61,
        131072,
        "https://huggingface.co/moonshotai/Kimi-K2-Instruct config.json (FP8 e4m3, "
        "128x128 blocks); 61 shards, about 959 GiB",
        f"{RECIPES}/Kimi-K2-Instruct.yaml (supports_dcp: true, -dcp 8 on H200)",
    ),
    "moonshotai/Kimi-K2-Base": _k2_fp8(
        "moonshotai/Kimi-K2-Base",
        61,
        131072,
        "https://huggingface.co/moonshotai/Kimi-K2-Base config.json, as Instruct",
    ),
    "moonshotai/Kimi-K2-Instruct-0905": _k2_fp8(
        "moonshotai/Kimi-K2-Instruct-0905",
        62,
        262144,
        "https://huggingface.co/moonshotai/Kimi-K2-Instruct-0905 config.json "
        "(262144 context); 62 shards model-000NN-of-000062",
    ),
    "moonshotai/Kimi-K2-Thinking": ModelSpec(
        id="moonshotai/Kimi-K2-Thinking",
        **{**_KIMI_K2_CONFIG, "max_position_embeddings": 262144},
        quantization=INT4_EXPERTS,
        checkpoint_gib=553.3,
        shard_count=62,
        reasoning_parser="kimi_k2",
        decode_context_parallel=True,
        sources=(
            "https://huggingface.co/moonshotai/Kimi-K2-Thinking config.json: compressed-tensors "
            "pack-quantized INT4 group 32 for routed experts, BF16 elsewhere; 262144 context",
            "about 594 GB (553.3 GiB) in 62 shards",
            f"{RECIPES}/Kimi-K2-Thinking.yaml: TP8 on 8xH200, --reasoning-parser kimi_k2, "
            "supports_dcp (TP8 KV cache 715,072 tokens; TP8+DCP8 5,721,088)",
        ),
    ),
    "moonshotai/Kimi-K2.5": _k25_family(
        "moonshotai/Kimi-K2.5",
        f"{RECIPES}/Kimi-K2.5.yaml: TP8 on 8xH200, --language-model-only for text only",
    ),
    "moonshotai/Kimi-K2.6": _k25_family(
        "moonshotai/Kimi-K2.6",
        f"{RECIPES}/Kimi-K2.6.yaml: same architecture as K2.5",
    ),
    "moonshotai/Kimi-K2.7-Code": _k25_family(
        "moonshotai/Kimi-K2.7-Code",
        f"{RECIPES}/Kimi-K2.7-Code.yaml: built on K2.6, thinking only (keep the reasoning parser)",
    ),
}

# The family by checkpoint format, for the engines' support tables (each engine's SUPPORT).
FP8_FAMILY = tuple(m for m, spec in MODELS.items() if spec.quantization == FP8_EVERYWHERE)
INT4_FAMILY = tuple(m for m in MODELS if m not in FP8_FAMILY)

# Models people ask for that are not Kimi-K2 variants: refused with the reason.
NOT_K2: dict[str, str] = {
    "moonshotai/Kimi-K3": "Kimi-K3 is a different architecture (Kimi Delta Attention, 896 "
    "experts, 2.8T parameters), not a Kimi-K2 variant",
    "moonshotai/Kimi-Linear-48B-A3B-Instruct": "Kimi-Linear is a hybrid linear-attention "
    "model, not a Kimi-K2 variant",
}

# ---------------------------------------------------------------- GPUs

GPUS: dict[str, GpuSpec] = {
    # driver_reserved_mib: nvidia-smi total minus the total vLLM logs from cudaMemGetInfo
    # ("total_gpu_memory"): H200 143771 MiB vs 139.81 GiB, H100 81559 MiB vs 79.22 GiB.
    # For the others the H100's 438 MiB is used until a measurement says otherwise.
    "h200": GpuSpec(
        key="h200",
        product_pattern=r"\bH200\b",
        memory_mib=143771,
        driver_reserved_mib=605,
        fp8=True,
        sm=90,
        nvswitch=True,
        min_driver="550.54",
    ),
    "h100": GpuSpec(
        key="h100",
        product_pattern=r"\bH100\b",
        memory_mib=81559,
        driver_reserved_mib=438,
        fp8=True,
        sm=90,
        nvswitch=True,
        min_driver="525.60",
    ),
    "h800": GpuSpec(
        key="h800",
        product_pattern=r"\bH800\b",
        memory_mib=81559,
        driver_reserved_mib=438,
        fp8=True,
        sm=90,
        nvswitch=True,
        min_driver="525.60",
    ),
    "h20": GpuSpec(
        key="h20",
        product_pattern=r"\bH20\b",
        memory_mib=97871,
        driver_reserved_mib=438,
        fp8=True,
        sm=90,
        nvswitch=True,
        min_driver="535.104",
    ),
    "b200": GpuSpec(
        key="b200",
        product_pattern=r"\bB200\b",
        memory_mib=183359,
        driver_reserved_mib=438,
        fp8=True,
        fp4=True,
        sm=100,
        nvswitch=True,
        min_driver="570.124",
    ),
    "a100": GpuSpec(
        key="a100",
        product_pattern=r"\bA100\b.*80GB",
        memory_mib=81920,
        driver_reserved_mib=438,
        fp8=False,
        sm=80,
        nvswitch=True,
        min_driver="450.80",
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
        known = ", ".join(MODELS)
        reason = NOT_K2.get(model_id)
        if reason:
            raise InventoryError(
                [
                    f"k2_model={model_id}: {reason}; k2provision plans the Kimi-K2 family "
                    f"only ({known}); fix: set k2_model to one of them"
                ]
            ) from None
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
    """`base` with the numbers and weight formats of a local config.json."""
    where = f"k2_model_config_json={config_json}"
    try:
        raw = load_config_json(bounded_read.read_text(config_json, bounded_read.CONFIG_FILE_LIMIT))
    except (OSError, ValueError) as exc:
        raise InventoryError(
            [
                f"{where}: cannot read a config.json there "
                f"({exc}); fix: point it at the model's config.json on the controller, "
                "or unset it"
            ]
        ) from None
    try:
        spec = spec_from_config(base, raw)
    except ConfigProblems as exc:
        raise InventoryError(
            f"{where}: {problem}; fix: correct the config.json, or unset k2_model_config_json "
            "to use the catalog's numbers"
            for problem in exc.problems
        ) from None
    if (
        spec.quantization != base.quantization
        or spec.vision != base.vision
        or any(getattr(spec, k) != getattr(base, k) for k in _KIMI_K2_CONFIG)
    ):
        spec = spec.model_copy(update={"checkpoint_gib": round(weights(spec).total / GIB, 1)})
    return spec


# ---------------------------------------------------------------- weight sizes


@dataclass(frozen=True)
class WeightClasses:
    """Bytes of each class of weights in the whole checkpoint."""

    routed_experts: float
    attention_replicated: float  # q_a_proj and kv_a_proj_with_mqa: never split by TP
    attention_split: float  # q_b, kv_b and o projections: split over attention TP
    shared_experts: float
    dense_mlp: float
    gates: float  # routers, BF16
    embeddings: float  # embed_tokens and lm_head, BF16
    vision: float  # vision tower and projector, BF16

    @property
    def total(self) -> float:
        """The whole checkpoint."""
        return (
            self.routed_experts
            + self.attention_replicated
            + self.attention_split
            + self.shared_experts
            + self.dense_mlp
            + self.gates
            + self.embeddings
            + self.vision
        )


def kv_bytes_per_token_per_layer(spec: ModelSpec, dtype_bytes: int = 2) -> int:
    """MLA caches one compressed latent plus the rope key per token and layer."""
    return (spec.kv_lora_rank + spec.qk_rope_head_dim) * dtype_bytes


def routed_expert_params_per_layer(spec: ModelSpec) -> int:
    """Parameters of one routed expert in one MoE layer (gate, up and down projections)."""
    return 3 * spec.hidden_size * spec.moe_intermediate_size


def moe_layers(spec: ModelSpec) -> int:
    """Number of layers whose MLP is a mixture of experts."""
    return spec.num_hidden_layers - spec.first_k_dense_replace


def attention_params(spec: ModelSpec) -> tuple[int, int]:
    """Parameters of the MLA projections over all layers: (replicated, split over TP)."""
    h = spec.hidden_size
    heads = spec.num_attention_heads
    replicated = h * spec.q_lora_rank + h * (spec.kv_lora_rank + spec.qk_rope_head_dim)
    split = (
        spec.q_lora_rank * heads * (spec.qk_nope_head_dim + spec.qk_rope_head_dim)
        + spec.kv_lora_rank * heads * (spec.qk_nope_head_dim + spec.v_head_dim)
        + heads * spec.v_head_dim * h
    )
    return replicated * spec.num_hidden_layers, split * spec.num_hidden_layers


def vision_params(vision: VisionSpec, text_hidden: int) -> int:
    """MoonViT: patch embedding, position embedding, encoder blocks, and the projector."""
    h, i = vision.hidden_size, vision.intermediate_size
    block = 4 * h * h + 2 * h * i + 9 * h + i  # wqkv, wo, two MLP matrices, biases, norms
    merged = h * vision.merge_kernel[0] * vision.merge_kernel[1]
    projector = merged * merged + merged * text_hidden + 2 * h + merged + text_hidden
    return (
        3 * vision.patch_size**2 * h
        + h
        + vision.pos_emb_height * vision.pos_emb_width * h
        + vision.num_hidden_layers * block
        + projector
    )


def weights(spec: ModelSpec) -> WeightClasses:
    """Bytes per weight class, each in the format the model's quantization gives it."""
    q = spec.quantization
    h = spec.hidden_size
    replicated, split = attention_params(spec)
    routed = routed_expert_params_per_layer(spec) * spec.n_routed_experts * moe_layers(spec)
    shared = routed_expert_params_per_layer(spec) * spec.n_shared_experts * moe_layers(spec)
    dense = 3 * h * spec.intermediate_size * spec.first_k_dense_replace
    return WeightClasses(
        routed_experts=routed * q.routed_experts.bytes_per_param,
        attention_replicated=replicated * q.attention.bytes_per_param,
        attention_split=split * q.attention.bytes_per_param,
        shared_experts=shared * q.shared_experts.bytes_per_param,
        dense_mlp=dense * q.dense_mlp.bytes_per_param,
        gates=spec.n_routed_experts * h * moe_layers(spec) * 2,
        embeddings=2 * spec.vocab_size * h * 2,
        vision=vision_params(spec.vision, h) * 2 if spec.vision else 0.0,
    )


def one_expert_all_layers_bytes(spec: ModelSpec) -> float:
    """Bytes that one extra (redundant) expert slot costs a GPU: one expert in every MoE layer."""
    params = routed_expert_params_per_layer(spec) * moe_layers(spec)
    return params * spec.quantization.routed_experts.bytes_per_param


def routed_expert_bytes(spec: ModelSpec) -> float:
    """Bytes of all routed experts over all MoE layers."""
    return weights(spec).routed_experts


def total_params(spec: ModelSpec) -> int:
    """Parameter count of the language model (about 1.03e12 for Kimi-K2)."""
    h = spec.hidden_size
    replicated, split = attention_params(spec)
    experts = (
        routed_expert_params_per_layer(spec)
        * (spec.n_routed_experts + spec.n_shared_experts)
        * moe_layers(spec)
    )
    return (
        replicated
        + split
        + experts
        + 3 * h * spec.intermediate_size * spec.first_k_dense_replace
        + spec.n_routed_experts * h * moe_layers(spec)
        + 2 * spec.vocab_size * h
    )
