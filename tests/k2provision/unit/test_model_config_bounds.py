"""config.json judged, not only parsed: nesting, sizes and numbers are bounded, fields that
contradict each other are refused as the engines would meet them, and no config.json, however
written, crashes the reader or plans a negative or infinite size."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from k2provision.core import catalog, model_config
from k2provision.core.model_config import (
    ARCH_FIELDS,
    MAX_DEPTH,
    ConfigProblems,
    load_config_json,
    pattern_problem,
    spec_from_config,
)
from k2provision.errors import K2Error
from k2provision.plan.assemble import build_plan
from k2provision.plan.inventory import load_cluster
from k2provision.run.render_files import write_render

BASE = catalog.model("moonshotai/Kimi-K2-Instruct")
K2 = model_config.config_json(BASE)
K25 = model_config.config_json(catalog.model("moonshotai/Kimi-K2.5"))


def refusals(config: Any) -> list[str]:
    with pytest.raises(ConfigProblems) as info:
        spec_from_config(BASE, config)
    return info.value.problems


@pytest.mark.parametrize(
    ("update", "names"),
    [
        ({"first_k_dense_replace": 62}, "first_k_dense_replace=62 with num_hidden_layers=61"),
        ({"first_k_dense_replace": 61}, "expected fewer dense layers than layers"),
        ({"num_hidden_layers": 1, "first_k_dense_replace": 1}, "first_k_dense_replace=1"),
        ({"num_experts_per_tok": 385}, "num_experts_per_tok=385 with n_routed_experts=384"),
        ({"n_routed_experts": 4}, "num_experts_per_tok=8 with n_routed_experts=4"),
        ({"n_group": 5}, "n_group=5 with n_routed_experts=384"),
        ({"n_group": 0}, "n_group=0: expected an integer from 1"),
        ({"n_group": 8, "topk_group": 9}, "topk_group=9 with n_group=8"),
        ({"n_group": 384, "topk_group": 1}, "num_experts_per_tok=8 with topk_group=1"),
        ({"hidden_size": 10**30}, "hidden_size=(an integer of about 31 digits)"),
        ({"vocab_size": 2**40}, "expected an integer from 1 to 16777216"),
        ({"num_hidden_layers": 1e999}, "num_hidden_layers=inf"),
        ({"max_position_embeddings": -(10**25)}, "max_position_embeddings=-(an integer"),
    ],
)
def test_contradicting_or_huge_fields_are_refused(update: dict[str, Any], names: str) -> None:
    found = refusals({**K2, **update})
    assert any(names in p for p in found), found


def test_the_family_passes_the_consistency_rules() -> None:
    for spec in catalog.MODELS.values():
        config = model_config.config_json(spec)
        text = config.get("text_config", config)
        text.update({"n_group": 1, "topk_group": 1})  # as Kimi-K2's config.json has them
        assert spec_from_config(BASE, config).num_hidden_layers == spec.num_hidden_layers


def test_the_k25_form_is_judged_in_its_text_config() -> None:
    config = json.loads(json.dumps(K25))
    config["text_config"]["first_k_dense_replace"] = 99
    found = refusals(config)
    assert any(p.startswith("text_config.first_k_dense_replace=99") for p in found), found


@pytest.mark.parametrize(
    ("quantization", "names"),
    [
        ({"quant_method": "fp8", "weight_block_size": [128, 2**40]}, "weight_block_size"),
        (
            {
                "quant_method": "modelopt",
                "quantization": {"quant_algo": "NVFP4", "group_size": "x"},
            },
            "group_size='x': expected an integer from 1",
        ),
        (
            {"quant_method": "modelopt", "quantization": {"quant_algo": "NVFP4", "group_size": -4}},
            "group_size=-4",
        ),
        (
            {
                "quant_method": "quark",
                "global_quant_config": {
                    "weight": {"dtype": "fp4", "qscheme": "per_group", "group_size": [1]}
                },
            },
            "group_size=a list",
        ),
        (
            {
                "quant_method": "compressed-tensors",
                "config_groups": {
                    "g": {
                        "weights": {
                            "num_bits": 8,
                            "type": "float",
                            "strategy": "block",
                            "block_structure": ["a", 128],
                        }
                    }
                },
            },
            "block_structure[0]='a'",
        ),
        (
            {
                "quant_method": "compressed-tensors",
                "config_groups": {"g": {"weights": {"num_bits": 4, "type": "float"}}},
                "ignore": ["re:(a+)+$"],
            },
            "'re:(a+)+$' repeats a group",
        ),
        (
            {
                "quant_method": "compressed-tensors",
                "config_groups": {"g": {"targets": ["re:("], "weights": {"num_bits": 4}}},
            },
            "'re:(' is not a regular expression",
        ),
    ],
)
def test_quantization_sizes_and_patterns_are_refused_not_crashed_on(
    quantization: dict[str, Any], names: str
) -> None:
    found = refusals({**K2, "quantization_config": quantization})
    assert any(names in p for p in found), found


@pytest.mark.parametrize(
    ("pattern", "safe"),
    [
        ("re:.*self_attn.*", True),
        (r"re:.*mlp\.(gate|up|gate_up|down)_proj.*", True),
        ("lm_head", True),
        ("re:[(]a*[)]+", True),
        ("re:(a+)+$", False),
        ("re:(.|.)*x", False),
        ("re:((a)+)+", False),
        ("re:(?:a*)*", False),
        ("re:(a?){2,}", False),
        ("re:(", False),
        ("x" * 600, False),
    ],
)
def test_module_patterns_that_could_hang_are_refused(pattern: str, safe: bool) -> None:
    assert (pattern_problem(pattern) is None) is safe


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("[" * 100_000 + "]" * 100_000, f"nests deeper than {MAX_DEPTH} levels"),
        ('{"a":' * (MAX_DEPTH + 1) + "1" + "}" * (MAX_DEPTH + 1), "nests deeper"),
        ('{"hidden_size": NaN}', "holds NaN"),
        ('{"hidden_size": -Infinity}', "holds -Infinity"),
        ("[" + ",".join(["0"] * 200_001) + "]", "holds more than 200000 values"),
        ('{"hidden_size": ' + "9" * 5000 + "}", "digits"),
    ],
)
def test_text_past_the_bounds_is_refused_before_it_is_judged(text: str, why: str) -> None:
    with pytest.raises(ValueError, match=why.replace("(", r"\(")):
        load_config_json(text)


# Any JSON value, small: what a hostile or broken config.json may hold in a field.
JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**40), max_value=10**40)
    | st.floats(allow_nan=False)
    | st.sampled_from([0, 1, 2, 8, 61, 384, 4096, 2**31, "bfloat16", "re:(", "x"])
    | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)
FIELDS = (
    *ARCH_FIELDS,
    "n_group",
    "topk_group",
    "torch_dtype",
    "quantization_config",
    "text_config",
    "vision_config",
    "architectures",
    "model_type",
)
QUANT_FIELDS = ("weight_block_size", "modules_to_not_convert", "ignored_layers", "quant_method")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    base=st.sampled_from([K2, K25]),
    changes=st.dictionaries(st.sampled_from(FIELDS), JSON_VALUES, max_size=4),
    quant_changes=st.dictionaries(st.sampled_from(QUANT_FIELDS), JSON_VALUES, max_size=2),
)
def test_no_config_json_crashes_or_sizes_weights_negative(
    base: dict[str, Any], changes: dict[str, Any], quant_changes: dict[str, Any]
) -> None:
    config = json.loads(json.dumps(base))
    config.update(changes)
    if isinstance(config.get("quantization_config"), dict):
        config["quantization_config"].update(quant_changes)
    text = json.dumps(config)
    try:
        spec = spec_from_config(BASE, load_config_json(text))
    except (ConfigProblems, ValueError) as exc:
        lines = exc.problems if isinstance(exc, ConfigProblems) else [str(exc)]
        assert lines
        assert all(line and len(line) < 2000 for line in lines)
        return
    sizes = catalog.weights(spec)
    assert math.isfinite(sizes.total)
    assert sizes.total > 0
    assert all(v >= 0 for v in vars(sizes).values() if isinstance(v, float))
    assert 0 <= spec.first_k_dense_replace < spec.num_hidden_layers
    assert spec.num_experts_per_tok <= spec.n_routed_experts


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet='[]{}",:0123456789eE.-aNInfity ', max_size=400))
def test_any_text_is_read_or_refused_never_crashed_on(text: str) -> None:
    try:
        raw = load_config_json(text)
    except ValueError:
        return
    try:
        spec_from_config(BASE, raw)
    except ConfigProblems as exc:
        problems = exc.problems
    else:
        problems = ["read"]
    assert problems


# Numbers at and near the ends of their ranges, and a few in between.
EDGE_NUMBERS = st.sampled_from([0, 1, 2, 3, 7, 8, 61, 64, 384, 4096, 1 << 17, 1 << 24, 1 << 40])


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    changes=st.dictionaries(
        st.sampled_from((*ARCH_FIELDS, "n_group", "topk_group")), EDGE_NUMBERS, max_size=4
    )
)
def test_plan_and_render_never_crash_on_a_judged_config_json(
    tmp_path_factory: pytest.TempPathFactory, changes: dict[str, int]
) -> None:
    tmp = tmp_path_factory.mktemp("config")
    config = tmp / "config.json"
    config.write_text(json.dumps({**K2, **changes}))
    inv = tmp / "inv.ini"
    inv.write_text(
        "[nodes]\nn1 ansible_host=10.9.0.1\nn2 ansible_host=10.9.0.2\n[all:vars]\n"
        f"k2_engine=sglang\nk2_layout=tp\nk2_model_config_json={config}\n"
    )
    try:
        plan = build_plan(load_cluster(inv))
    except K2Error as refused:
        problems = refused.problems
    else:
        problems = ()
        assert write_render(plan, tmp / "out") > 0
        assert all(h.files for h in plan.hosts)
    assert all("fix:" in line for line in problems), problems
