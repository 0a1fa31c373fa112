"""config.json -> weight formats and numbers: every form of the family read, every bad value
refused with one line naming the field, and a config that cannot be sized never sized as FP8."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from k2provision.core import catalog, model_config
from k2provision.core.catalog import GIB
from k2provision.core.model_config import ConfigProblems, spec_from_config
from k2provision.core.records import ModelSpec

BASE = catalog.model("moonshotai/Kimi-K2-Instruct")


def spec_of(config: Any) -> ModelSpec:
    return spec_from_config(BASE, config)


def test_every_catalog_model_round_trips_through_its_config_json() -> None:
    for spec in catalog.MODELS.values():
        config = json.loads(json.dumps(model_config.config_json(spec)))
        again = spec_from_config(BASE.model_copy(update={"id": spec.id}), config)
        assert again.quantization == spec.quantization
        assert again.vision == spec.vision
        assert again.architectures == spec.architectures
        assert again.max_position_embeddings == spec.max_position_embeddings


def test_catalog_sizes_match_the_published_checkpoints() -> None:
    # Computed per weight class from the quantization; published: about 959 GiB (K2 FP8),
    # about 594 GB (K2-Thinking), 554.27 GiB of tensors in 64 shards (K2.5, with MoonViT).
    for spec in catalog.MODELS.values():
        total = catalog.weights(spec).total / GIB
        assert abs(total - spec.checkpoint_gib) / spec.checkpoint_gib < 0.005, spec.id
    thinking = catalog.model("moonshotai/Kimi-K2-Thinking")
    assert 590e9 < catalog.weights(thinking).total < 598e9
    k25 = catalog.weights(catalog.model("moonshotai/Kimi-K2.5"))
    assert 0.8 < k25.vision / GIB < 0.95


def test_k25_form_reads_text_config_and_its_quantization() -> None:
    config = model_config.config_json(catalog.model("moonshotai/Kimi-K2.5"))
    del config["quantization_config"]  # only the nested one: it must still be found
    spec = spec_of(config)
    assert spec.architectures == ("KimiK25ForConditionalGeneration",)
    assert spec.quantization.source == "text_config.quantization_config"
    assert spec.quantization.routed_experts.scheme == "int4_group"
    assert spec.quantization.routed_experts.group_size == 32
    assert spec.quantization.attention.scheme == "bf16"
    assert spec.vision is not None
    assert spec.vision.num_hidden_layers == 27


def test_int4_is_never_sized_as_fp8() -> None:
    # A K2.5 config.json given for the FP8 K2-Instruct entry: its formats win.
    config = model_config.config_json(catalog.model("moonshotai/Kimi-K2-Thinking"))
    spec = spec_of(config)
    fp8 = catalog.weights(BASE).routed_experts
    int4 = catalog.weights(spec).routed_experts
    assert 0.55 < int4 / fp8 < 0.57  # 4 bits + a BF16 scale per 32 vs 8 bits + tiny scales


def test_group_size_changes_the_size() -> None:
    config = model_config.config_json(catalog.model("moonshotai/Kimi-K2-Thinking"))
    config["quantization_config"]["config_groups"]["group_0"]["weights"]["group_size"] = 128
    spec = spec_of(config)
    assert spec.quantization.routed_experts.bytes_per_param == pytest.approx(0.5 + 2 / 128)


@pytest.mark.parametrize(
    ("quantization_config", "scheme", "bytes_per_param"),
    [
        # ModelOpt NVFP4 (nvidia/Kimi-K2-Thinking-NVFP4 style): e2m1 + an FP8 scale per 16.
        (
            {
                "quant_method": "modelopt",
                "quant_algo": "NVFP4",
                "group_size": 16,
                "exclude_modules": ["*self_attn*", "lm_head"],
            },
            "nvfp4",
            0.5 + 1 / 16,
        ),
        # AMD Quark MXFP4 (amd/Kimi-K2.5-MXFP4 style): e2m1 + an E8M0 scale per 32.
        (
            {
                "quant_method": "quark",
                "exclude": ["*self_attn*", "lm_head"],
                "global_quant_config": {
                    "weight": {"dtype": "fp4", "qscheme": "per_group", "group_size": 32}
                },
            },
            "mxfp4",
            0.5 + 1 / 32,
        ),
        # compressed-tensors NVFP4.
        (
            {
                "quant_method": "compressed-tensors",
                "format": "nvfp4-pack-quantized",
                "config_groups": {
                    "g": {
                        "targets": ["Linear"],
                        "weights": {
                            "num_bits": 4,
                            "type": "float",
                            "strategy": "tensor_group",
                            "group_size": 16,
                        },
                    }
                },
                "ignore": ["lm_head", "re:.*self_attn.*"],
            },
            "nvfp4",
            0.5 + 1 / 16,
        ),
    ],
)
def test_fp4_formats(
    quantization_config: dict[str, Any], scheme: str, bytes_per_param: float
) -> None:
    spec = spec_of({"quantization_config": quantization_config, "torch_dtype": "bfloat16"})
    assert spec.quantization.routed_experts.scheme == scheme
    assert spec.quantization.routed_experts.bytes_per_param == pytest.approx(bytes_per_param)
    assert spec.quantization.attention.scheme == "bf16"  # excluded above


def test_unquantized_weights_need_a_dtype() -> None:
    spec = spec_of({"torch_dtype": "bfloat16"})
    assert spec.quantization.schemes() == {"bf16"}
    assert spec.quantization.source == "torch_dtype"


def test_a_partial_override_keeps_the_entrys_formats() -> None:
    thinking = catalog.model("moonshotai/Kimi-K2-Thinking")
    spec = spec_from_config(thinking, {"max_position_embeddings": 65536})
    assert spec.quantization == thinking.quantization
    assert spec.max_position_embeddings == 65536


@pytest.mark.parametrize(
    ("config", "names"),
    [
        ([], "holds a list; expected a JSON object"),
        ("x", "holds 'x'; expected a JSON object"),
        (None, "holds null; expected a JSON object"),
        ({"quantization_config": None}, "quantization_config=null: expected an object"),
        ({"num_attention_heads": "64", "torch_dtype": "bfloat16"}, "num_attention_heads='64'"),
        ({"num_attention_heads": 0, "torch_dtype": "bfloat16"}, "num_attention_heads=0"),
        ({"max_position_embeddings": -1, "torch_dtype": "bfloat16"}, "max_position_embeddings=-1"),
        ({"hidden_size": True, "torch_dtype": "bfloat16"}, "hidden_size=true"),
        (
            {
                "architectures": ["KimiK25ForConditionalGeneration"],
                "model_type": "kimi_k25",
                "text_config": {"num_hidden_layers": 61},
            },
            "quantization_config and torch_dtype: both missing",
        ),
        ({"torch_dtype": "int8"}, "torch_dtype='int8'"),
        ({"quantization_config": {"quant_method": "awq"}}, "quant_method='awq': cannot size"),
        (
            {"quantization_config": {"quant_method": "fp8", "weight_block_size": [128]}},
            "weight_block_size=a list",
        ),
        ({"quantization_config": {"quant_method": "compressed-tensors"}}, "config_groups=null"),
        ({"text_config": [], "torch_dtype": "bfloat16"}, "text_config=a list"),
        (
            {"architectures": ["KimiK3ForConditionalGeneration"], "model_type": "kimi_k3"},
            "not a Kimi-K2 variant",
        ),
        (
            {
                "architectures": ["KimiLinearForCausalLM"],
                "model_type": "kimi_linear",
                "linear_attn_config": {},
            },
            "not a Kimi-K2 variant",
        ),
        (
            {
                "architectures": ["DeepseekV3ForCausalLM"],
                "linear_attn_config": {},
                "torch_dtype": "bfloat16",
            },
            "linear_attn_config",
        ),
    ],
)
def test_bad_configs_are_refused_naming_the_field(config: Any, names: str) -> None:
    with pytest.raises(ConfigProblems) as info:
        spec_of(config)
    assert any(names in p for p in info.value.problems), info.value.problems


def test_several_problems_give_one_line_each() -> None:
    with pytest.raises(ConfigProblems) as info:
        spec_of(
            {
                "num_attention_heads": 0,
                "max_position_embeddings": -1,
                "vocab_size": "big",
                "torch_dtype": "bfloat16",
            }
        )
    assert len(info.value.problems) == 3


@pytest.mark.parametrize(
    ("content", "says"),
    [
        ("[]", ""),
        ('"x"', ""),
        ("null", ""),
        ('{"quantization_config": null}', ""),
        ('{"num_attention_heads": "64"}', ""),
        ('{"num_attention_heads": 0, "torch_dtype": "bfloat16"}', ""),
        ('{"max_position_embeddings": -1, "torch_dtype": "bfloat16"}', ""),
        ('{"architectures": ["KimiK3ForConditionalGeneration"], "model_type": "kimi_k3"}', ""),
        # Nesting far past the reader's depth bound (it used to end in a RecursionError).
        pytest.param("[" * 50_000 + "]" * 50_000, "nests deeper than", id="nested-50000"),
    ],
)
def test_plan_refuses_them_with_one_clear_line_and_exit_2(
    tmp_path: Path, content: str, says: str
) -> None:
    config = tmp_path / "config.json"
    config.write_text(content)
    inv = tmp_path / "inv.ini"
    inv.write_text(
        "[nodes]\nn1 ansible_host=10.9.0.1\n[all:vars]\nk2_engine=vllm\nk2_layout=tp\n"
        f"k2_model_config_json={config}\n"
    )
    out = subprocess.run(
        [sys.executable, "-m", "k2provision.cli", "plan", str(inv)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr
    lines = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, out.stderr
    assert f"k2_model_config_json={config}" in lines[0]
    assert "fix:" in lines[0]
    assert says in lines[0]
