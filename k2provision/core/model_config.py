"""A model's config.json, both ways: read into the numbers and weight formats the planner
sizes from, and written from a catalog entry (synthetic checkpoints, tests).

Pure: the caller reads the file. Every value is type- and range-checked; every problem is one
line naming the field, and a config whose weights cannot be sized is refused rather than
sized as something it is not. Both forms of the Kimi-K2 family are read: the flat
DeepseekV3ForCausalLM config (K2, K2-Thinking) and the multimodal KimiK25 config whose
language model, and its quantization_config, sit under ``text_config`` (K2.5 and later);
`config_json` writes either form back so that reading it gives the same entry.
"""

from __future__ import annotations

import fnmatch
import json
import re
from collections.abc import Mapping
from typing import Any

from k2provision.core.records import ModelSpec, Quantization, VisionSpec, WeightFormat

# The architectures k2provision plans: MLA attention + DeepSeek-V3-style MoE.
K2_ARCHITECTURES = ("DeepseekV3ForCausalLM", "KimiK25ForConditionalGeneration")
K2_MODEL_TYPES = ("kimi_k2", "deepseek_v3", "kimi_k25")
# Keys only other architectures carry (Kimi Linear / K3: hybrid linear attention).
FOREIGN_KEYS = ("linear_attn_config", "kda_layers", "full_attn_layers", "attn_res_config")

# Language-model numbers and the (least, greatest) value each may take. The upper ends are
# far above any checkpoint of the family (K2: hidden 7168, 61 layers, 384 experts, vocabulary
# 163840, 262144 positions) and keep every size the planner computes a finite number.
ARCH_FIELDS: dict[str, tuple[int, int]] = {
    "hidden_size": (1, 1 << 17),
    "num_hidden_layers": (1, 4096),
    "first_k_dense_replace": (0, 4096),
    "num_attention_heads": (1, 4096),
    "q_lora_rank": (1, 1 << 17),
    "kv_lora_rank": (1, 1 << 17),
    "qk_nope_head_dim": (1, 8192),
    "qk_rope_head_dim": (1, 8192),
    "v_head_dim": (1, 8192),
    "n_routed_experts": (1, 1 << 16),
    "num_experts_per_tok": (1, 4096),
    "n_shared_experts": (0, 4096),
    "moe_intermediate_size": (1, 1 << 20),
    "intermediate_size": (1, 1 << 20),
    "vocab_size": (1, 1 << 24),
    "max_position_embeddings": (1, 1 << 24),
}
# Expert grouping (DeepSeek-V3's grouped top-k routing); read only to be checked.
EXPERT_GROUP_FIELDS: dict[str, tuple[int, int]] = {
    "n_group": (1, 1 << 16),
    "topk_group": (1, 1 << 16),
}
# Vision tower numbers and quantization group and block sizes: the same kind of bound.
VISION_MAX = 1 << 17
GROUP_MAX = 1 << 20
# How deeply a config.json may nest (the family's nest three or four levels) and how many
# values it may hold in all; past either it is refused before it is read any further.
MAX_DEPTH = 32
MAX_VALUES = 200_000
# Vision tower numbers: the checkpoint's spelling first, then transformers' newer one.
VISION_FIELDS: dict[str, tuple[str, ...]] = {
    "hidden_size": ("vt_hidden_size", "hidden_size"),
    "num_hidden_layers": ("vt_num_hidden_layers", "num_hidden_layers"),
    "intermediate_size": ("vt_intermediate_size", "intermediate_size"),
    "patch_size": ("patch_size",),
    "pos_emb_height": ("init_pos_emb_height", "pos_emb_height"),
    "pos_emb_width": ("init_pos_emb_width", "pos_emb_width"),
}

# A representative module name per weight class, as compressed-tensors and ModelOpt match
# their target and ignore patterns against (multimodal checkpoints prefix language_model.).
CLASS_MODULES: dict[str, str] = {
    "routed_experts": "model.layers.1.mlp.experts.0.gate_proj",
    "attention": "model.layers.1.self_attn.q_a_proj",
    "shared_experts": "model.layers.1.mlp.shared_experts.gate_proj",
    "dense_mlp": "model.layers.0.mlp.gate_proj",
}

# ModelOpt MIXED_PRECISION names modules, not projections: how each class's key looks.
MIXED_PRECISION_KEYS: dict[str, str] = {
    "routed_experts": r"\.mlp\.experts$",
    "attention": r"\.self_attn(\.|$)",
    "shared_experts": r"\.shared_experts(\.|$)",
    "dense_mlp": r"layers\.0\.mlp(\.|$)",
}

BF16 = WeightFormat(scheme="bf16", bits=16)
FP16 = WeightFormat(scheme="fp16", bits=16)
DTYPES: dict[str, WeightFormat] = {"bfloat16": BF16, "float16": FP16}


class ConfigProblems(Exception):
    """One or more lines, each naming a config.json field, its value and the expectation."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


def _describe(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return repr(value)
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return str(value)


def _int_field(
    raw: Mapping[str, Any], key: str, least: int, where: str, out: list[str], most: int
) -> int | None:
    value = raw[key]
    expected = f"expected an integer from {least} to {most}"
    if isinstance(value, bool) or not isinstance(value, int):
        out.append(f"{where}{key}={_describe(value)}: {expected}")
        return None
    if not least <= value <= most:
        out.append(f"{where}{key}={_short_number(value)}: {expected}")
        return None
    return value


def _short_number(value: int) -> str:
    """An integer as a message shows it: a huge one by its digit count, not its digits."""
    if value.bit_length() <= 64:
        return str(value)
    digits = int(value.bit_length() * 0.30103) + 1
    return f"{'-' if value < 0 else ''}(an integer of about {digits} digits)"


def _size(value: Any, where: str, default: int) -> int:
    """A group or block size of a quantization scheme (`default` when absent)."""
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= GROUP_MAX:
        shown = _short_number(value) if isinstance(value, int) else _describe(value)
        raise ConfigProblems([f"{where}={shown}: expected an integer from 1 to {GROUP_MAX}"])
    return value


def shape_problem(raw: Any) -> str | None:
    """Why a parsed config.json is too deep or too big to be judged (None when it is not)."""
    pending: list[tuple[Any, int]] = [(raw, 1)]
    count = 0
    while pending:
        value, depth = pending.pop()
        count += 1
        if count > MAX_VALUES:
            return f"holds more than {MAX_VALUES} values; expected a model's config.json"
        if isinstance(value, dict | list):
            if depth > MAX_DEPTH:
                return (
                    f"nests deeper than {MAX_DEPTH} levels; expected a model's config.json "
                    "(a few levels)"
                )
            items = value.values() if isinstance(value, dict) else value
            pending.extend((item, depth + 1) for item in items)
    return None


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"holds {name}, which is not JSON; expected finite numbers")


def load_config_json(text: str) -> Any:
    """The value of a config.json's text; ValueError saying why it is not to be judged (not
    JSON, NaN or Infinity, nested or sized past the bounds above)."""
    try:
        raw = json.loads(text, parse_constant=_refuse_constant)
    except RecursionError:
        raise ValueError(f"nests deeper than {MAX_DEPTH} levels") from None
    if why := shape_problem(raw):
        raise ValueError(why)
    return raw


def spec_from_config(base: ModelSpec, raw: Any) -> ModelSpec:
    """`base` with the numbers and weight formats of a config.json; ConfigProblems if wrong.

    Numbers the config omits keep the catalog's values. The weight formats of a model's
    config.json (it names its architectures) come from the config alone: its
    quantization_config, or its dtype when the weights are unquantized; a config that has
    neither cannot be sized. A partial override (numbers only) keeps `base`'s formats.
    """
    if not isinstance(raw, dict):
        raise ConfigProblems(
            [f"the file holds {_describe(raw)}; expected a JSON object (a model's config.json)"]
        )
    if why := shape_problem(raw):
        raise ConfigProblems([f"the file {why}"])
    problems: list[str] = []
    architectures = raw.get("architectures", list(base.architectures))
    model_type = raw.get("model_type", base.model_type)
    if not (
        isinstance(architectures, list | tuple) and all(isinstance(a, str) for a in architectures)
    ):
        raise ConfigProblems(
            [f"architectures={_describe(architectures)}: expected a list of class names"]
        )
    if not isinstance(model_type, str):
        raise ConfigProblems([f"model_type={_describe(model_type)}: expected a string"])
    nested = raw.get("text_config")
    nested = nested if isinstance(nested, dict) else {}
    foreign = [k for k in FOREIGN_KEYS if k in raw or k in nested]
    if (
        not any(a in K2_ARCHITECTURES for a in architectures)
        or foreign
        or (model_type not in K2_MODEL_TYPES)
    ):
        what = f"architectures {list(architectures)}, model_type {model_type!r}" + (
            f", {', '.join(foreign)}" if foreign else ""
        )
        raise ConfigProblems(
            [
                f"{what}: not a Kimi-K2 variant; k2provision plans only "
                f"{' and '.join(K2_ARCHITECTURES)} (MLA attention + 384-expert MoE), and a "
                "different architecture (hybrid linear attention, Kimi-K3) would be mis-planned"
            ]
        )

    text = raw
    prefix = ""
    if "text_config" in raw:
        if not isinstance(raw["text_config"], dict):
            raise ConfigProblems(
                [f"text_config={_describe(raw['text_config'])}: expected an object"]
            )
        text = raw["text_config"]
        prefix = "text_config."

    update: dict[str, Any] = {"architectures": tuple(architectures), "model_type": model_type}
    for key, (least, most) in ARCH_FIELDS.items():
        if key in text:
            value = _int_field(text, key, least, prefix, problems, most)
            if value is not None:
                update[key] = value
    groups = {
        key: _int_field(text, key, least, prefix, problems, most)
        for key, (least, most) in EXPERT_GROUP_FIELDS.items()
        if key in text
    }
    numbers = {k: update.get(k, getattr(base, k)) for k in ARCH_FIELDS}
    problems.extend(consistency_problems(numbers, groups, prefix))
    if _declares_formats(raw, text) or "architectures" in raw:
        quantization = _quantization(raw, text, prefix, problems)
    else:
        # A partial override (numbers only, no architectures): the k2_model entry's formats.
        quantization = base.quantization
    vision = _vision(raw, problems)
    if problems:
        raise ConfigProblems(problems)
    assert quantization is not None
    update["quantization"] = quantization
    update["vision"] = vision
    merged = {**base.model_dump(), **update}
    return ModelSpec.model_validate({**merged, "quantization": quantization, "vision": vision})


def consistency_problems(
    numbers: Mapping[str, int], groups: Mapping[str, int | None], prefix: str
) -> list[str]:
    """Fields that contradict each other, as the engines meet them (SGLang 0.5.23, vLLM 0.33.0,
    transformers' DeepseekV3Config):

    - a layer is MoE when its index is >= first_k_dense_replace (deepseek_v2.py of both
      engines), so fewer dense layers than num_hidden_layers, or the model has no MoE layer;
    - each token takes the top num_experts_per_tok of n_routed_experts (torch.topk past the
      experts fails; SGLang's fused gate, layers/moe/mega_gate.py, takes 0 < top_k <= experts);
    - grouped routing views the experts as n_group equal groups and keeps topk_group of them
      (vLLM's grouped_topk_router.py falls back to ungrouped routing, a different model, when
      n_group does not divide the experts; SGLang's layers/moe/topk.py takes its fused
      grouped path only with topk_group <= num_expert_group), and the top-k experts are
      chosen among the kept groups' experts, so these must number at least top-k.
    """
    problems = []
    layers = numbers["num_hidden_layers"]
    dense = numbers["first_k_dense_replace"]
    if dense >= layers:
        problems.append(
            f"{prefix}first_k_dense_replace={dense} with {prefix}num_hidden_layers={layers}: "
            "expected fewer dense layers than layers (a Kimi-K2 model has MoE layers after "
            "its first_k_dense_replace dense ones)"
        )
    experts = numbers["n_routed_experts"]
    top_k = numbers["num_experts_per_tok"]
    if top_k > experts:
        problems.append(
            f"{prefix}num_experts_per_tok={top_k} with {prefix}n_routed_experts={experts}: "
            "expected at most as many experts per token as routed experts"
        )
    n_group, topk_group = groups.get("n_group"), groups.get("topk_group")
    if n_group is not None and experts % n_group:
        problems.append(
            f"{prefix}n_group={n_group} with {prefix}n_routed_experts={experts}: expected a "
            "number of expert groups that divides the routed experts"
        )
    elif n_group is not None and topk_group is not None:
        if topk_group > n_group:
            problems.append(
                f"{prefix}topk_group={topk_group} with {prefix}n_group={n_group}: expected "
                "at most as many chosen groups as groups"
            )
        elif top_k <= experts and top_k > topk_group * (experts // n_group):
            problems.append(
                f"{prefix}num_experts_per_tok={top_k} with {prefix}topk_group={topk_group} of "
                f"{prefix}n_group={n_group} groups of {experts // n_group} experts: expected "
                "at most as many experts per token as the chosen groups hold"
            )
    return problems


def _declares_formats(raw: Mapping[str, Any], text: Mapping[str, Any]) -> bool:
    keys = ("quantization_config", "torch_dtype", "dtype")
    return any(k in config for config in (raw, text) for k in keys)


def _vision(raw: Mapping[str, Any], problems: list[str]) -> VisionSpec | None:
    if "vision_config" not in raw:
        return None
    config = raw["vision_config"]
    if not isinstance(config, dict):
        problems.append(f"vision_config={_describe(config)}: expected an object")
        return None
    values: dict[str, Any] = {}
    for name, keys in VISION_FIELDS.items():
        key = next((k for k in keys if k in config), None)
        if key is None:
            if name.startswith("pos_emb"):
                continue
            problems.append(f"vision_config.{keys[0]}: missing; expected an integer >= 1")
            continue
        value = _int_field(config, key, 1, "vision_config.", problems, VISION_MAX)
        if value is not None:
            values[name] = value
    kernel = config.get("merge_kernel_size", [2, 2])
    if (
        not isinstance(kernel, list | tuple)
        or len(kernel) != 2
        or not all(
            isinstance(k, int) and not isinstance(k, bool) and 0 < k <= VISION_MAX for k in kernel
        )
    ):
        problems.append(
            f"vision_config.merge_kernel_size={_describe(kernel)}: expected two integers from 1 "
            f"to {VISION_MAX}"
        )
    else:
        values["merge_kernel"] = (kernel[0], kernel[1])
    if any(
        name not in values
        for name in (
            "hidden_size",
            "num_hidden_layers",
            "intermediate_size",
            "patch_size",
            "merge_kernel",
        )
    ):
        return None  # the missing ones are in problems already
    return VisionSpec(**values)


def _quantization(
    raw: Mapping[str, Any], text: Mapping[str, Any], prefix: str, problems: list[str]
) -> Quantization | None:
    """The weight formats: the language model's quantization_config, else its dtype."""
    for where, config in ((prefix, text), ("", raw)):
        if "quantization_config" in config:
            field = f"{where}quantization_config"
            qc = config["quantization_config"]
            if not isinstance(qc, dict):
                problems.append(
                    f"{field}={_describe(qc)}: expected an object with a quant_method "
                    "(fp8, compressed-tensors, modelopt or quark); remove the key for "
                    "unquantized weights"
                )
                return None
            dense = _dtype(raw, text, prefix, [], required=False) or BF16
            try:
                return _parse_quantization(qc, field, dense)
            except ConfigProblems as exc:
                problems.extend(exc.problems)
                return None
    dtype = _dtype(raw, text, prefix, problems, required=True)
    if dtype is None:
        return None
    field = next(
        f"{where}{k}"
        for where, c in ((prefix, text), ("", raw))
        for k in ("torch_dtype", "dtype")
        if k in c
    )
    return Quantization(
        routed_experts=dtype, attention=dtype, shared_experts=dtype, dense_mlp=dtype, source=field
    )


def _dtype(
    raw: Mapping[str, Any],
    text: Mapping[str, Any],
    prefix: str,
    problems: list[str],
    *,
    required: bool,
) -> WeightFormat | None:
    for where, config in ((prefix, text), ("", raw)):
        for key in ("torch_dtype", "dtype"):
            if key in config:
                value = config[key]
                if isinstance(value, str) and value in DTYPES:
                    return DTYPES[value]
                problems.append(f"{where}{key}={_describe(value)}: expected {' or '.join(DTYPES)}")
                return None
    if required:
        problems.append(
            "quantization_config and torch_dtype: both missing, so the weights cannot be "
            "sized; expected the model's quantization_config, or torch_dtype for unquantized "
            "weights"
        )
    return None


def _parse_quantization(
    qc: Mapping[str, Any], field: str, unquantized: WeightFormat
) -> Quantization:
    method = qc.get("quant_method")
    parsers = {
        "fp8": _fp8,
        "compressed-tensors": _compressed_tensors,
        "modelopt": _modelopt,
        "modelopt_fp4": _modelopt,
        "quark": _quark,
    }
    if not isinstance(method, str) or method not in parsers:
        raise ConfigProblems(
            [
                f"{field}.quant_method={_describe(method)}: cannot size these weights; "
                f"expected one of {', '.join(parsers)}"
            ]
        )
    formats = parsers[str(method)](qc, field, unquantized)
    return Quantization(**formats, source=field)


def _class_names(name: str) -> tuple[str, str]:
    return (CLASS_MODULES[name], f"language_model.{CLASS_MODULES[name]}")


def _regex_or_name(pattern: str, module: str) -> bool:
    if pattern.startswith("re:"):
        return re.match(pattern[3:], module) is not None
    return pattern == module or module.endswith(f".{pattern}")


def _glob(pattern: str, module: str) -> bool:
    if pattern.startswith("re:"):
        return re.match(pattern[3:], module) is not None
    return fnmatch.fnmatchcase(module, pattern)


def _string_list(qc: Mapping[str, Any], key: str, field: str) -> list[str]:
    value = qc.get(key) or []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigProblems([f"{field}.{key}={_describe(value)}: expected a list of strings"])
    for pattern in value:
        if why := pattern_problem(pattern):
            raise ConfigProblems([f"{field}.{key}: {pattern[:80]!r} {why}"])
    return value


PATTERN_MAX = 512


def _nested_repeat(regex: str) -> bool:
    """Whether a group that repeats (``(...)*``, ``+``, ``{n,m}``) holds a repetition or an
    alternation: the form whose matching time can grow exponentially with the name matched."""
    stack = [False]  # per open group: does its body repeat or alternate?
    i = 0
    while i < len(regex):
        char = regex[i]
        if char == "\\":
            i += 2
            continue
        if char == "[":  # a character class: skip to its end
            i += 2 if regex[i + 1 : i + 2] == "]" else 1
            while i < len(regex) and regex[i] != "]":
                i += 2 if regex[i] == "\\" else 1
        elif char == "(":
            stack.append(False)
        elif char == ")" and len(stack) > 1:
            inner = stack.pop()
            repeated = regex[i + 1 : i + 2] in ("*", "+", "{")
            if inner and repeated:
                return True
            stack[-1] = stack[-1] or inner or repeated
        elif char in "*+{|" or (char == "?" and regex[i - 1] != "("):
            stack[-1] = True
        i += 1
    return False


def pattern_problem(pattern: str) -> str | None:
    """Why a module pattern (a name, a glob, or ``re:`` and a regular expression) cannot be
    matched safely (None when it can): too long, not a regular expression, or one whose
    matching could take exponential time."""
    if len(pattern) > PATTERN_MAX:
        return f"is {len(pattern)} characters long; expected at most {PATTERN_MAX}"
    if not pattern.startswith("re:"):
        return None
    try:
        re.compile(pattern[3:])
    except re.error as exc:
        return f"is not a regular expression ({exc}); expected one Python's re module reads"
    if _nested_repeat(pattern[3:]):
        return (
            "repeats a group that itself repeats or alternates, which can take exponential "
            "time to match; expected a simpler pattern (e.g. re:.*self_attn.*)"
        )
    return None


def _fp8(qc: Mapping[str, Any], field: str, unquantized: WeightFormat) -> dict[str, WeightFormat]:
    block = qc.get("weight_block_size")
    if block is None:
        fmt = WeightFormat(scheme="fp8_channel", bits=8)
    elif (
        isinstance(block, list)
        and len(block) == 2
        and all(
            isinstance(b, int) and not isinstance(b, bool) and 0 < b <= GROUP_MAX for b in block
        )
    ):
        # One float32 scale per block (DeepSeek-V3's weight_scale_inv).
        fmt = WeightFormat(
            scheme="fp8_block", bits=8, group_size=block[0] * block[1], scale_bytes=4
        )
    else:
        raise ConfigProblems(
            [
                f"{field}.weight_block_size={_describe(block)}: expected two integers from 1 "
                f"to {GROUP_MAX}"
            ]
        )
    skip = _string_list(qc, "modules_to_not_convert", field) + _string_list(
        qc, "ignored_layers", field
    )
    return {
        name: unquantized
        if any(_glob(f"*{p}*", m) for p in skip for m in _class_names(name))
        else fmt
        for name in CLASS_MODULES
    }


def _ct_format(weights: Any, fmt: str, where: str) -> WeightFormat:
    """A compressed-tensors weights scheme -> WeightFormat."""
    if not isinstance(weights, dict):
        raise ConfigProblems([f"{where}.weights={_describe(weights)}: expected an object"])
    bits = weights.get("num_bits")
    kind = weights.get("type")
    strategy = weights.get("strategy")
    group = weights.get("group_size")
    if isinstance(bits, bool) or not isinstance(bits, int) or bits <= 0:
        raise ConfigProblems([f"{where}.weights.num_bits={_describe(bits)}: expected 4 or 8"])
    if kind == "int" and bits == 4 and strategy == "group":
        if group is None:
            raise ConfigProblems(
                [f"{where}.weights.group_size=null: expected an integer from 1 to {GROUP_MAX}"]
            )
        group = _size(group, f"{where}.weights.group_size", 0)
        # Packed int32 of eight values; one BF16 scale per group (plus a packed zero point
        # per group when asymmetric).
        zero_point = 0.0 if weights.get("symmetric", True) else 0.5
        return WeightFormat(
            scheme="int4_group", bits=4, group_size=group, scale_bytes=2 + zero_point
        )
    if kind == "float" and bits == 4:
        if fmt.startswith("mxfp4") or group == 32:
            return WeightFormat(scheme="mxfp4", bits=4, group_size=32, scale_bytes=1)
        size = _size(group, f"{where}.weights.group_size", 16)
        return WeightFormat(scheme="nvfp4", bits=4, group_size=size, scale_bytes=1)
    if kind == "float" and bits == 8:
        block = weights.get("block_structure")
        if strategy == "block" and isinstance(block, list) and len(block) == 2:
            rows = _size(block[0], f"{where}.weights.block_structure[0]", 1)
            columns = _size(block[1], f"{where}.weights.block_structure[1]", 1)
            return WeightFormat(
                scheme="fp8_block", bits=8, group_size=rows * columns, scale_bytes=4
            )
        return WeightFormat(scheme="fp8_channel", bits=8)
    raise ConfigProblems(
        [
            f"{where}.weights: type={_describe(kind)} num_bits={bits} "
            f"strategy={_describe(strategy)}: cannot size this scheme; expected int4 groups, "
            "FP8 (block or channel), NVFP4 or MXFP4"
        ]
    )


def _compressed_tensors(
    qc: Mapping[str, Any], field: str, unquantized: WeightFormat
) -> dict[str, WeightFormat]:
    groups = qc.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        raise ConfigProblems(
            [
                f"{field}.config_groups={_describe(groups)}: expected an object of "
                "quantization groups"
            ]
        )
    fmt = qc.get("format", "")
    if not isinstance(fmt, str):
        raise ConfigProblems([f"{field}.format={_describe(fmt)}: expected a string"])
    ignore = _string_list(qc, "ignore", field)
    schemes: list[tuple[list[str], WeightFormat]] = []
    for name, group in groups.items():
        where = f"{field}.config_groups.{name}"
        if not isinstance(group, dict):
            raise ConfigProblems([f"{where}={_describe(group)}: expected an object"])
        targets = group.get("targets", ["Linear"])
        if not isinstance(targets, list) or not all(isinstance(t, str) for t in targets):
            raise ConfigProblems([f"{where}.targets={_describe(targets)}: expected a list"])
        _string_list(group, "targets", where)
        schemes.append((targets, _ct_format(group.get("weights"), fmt, where)))
    out: dict[str, WeightFormat] = {}
    for name in CLASS_MODULES:
        modules = _class_names(name)
        if any(_regex_or_name(p, m) for p in ignore for m in modules):
            out[name] = unquantized
            continue
        chosen = next(
            (
                w
                for targets, w in schemes
                if any(t == "Linear" or _regex_or_name(t, m) for t in targets for m in modules)
            ),
            None,
        )
        out[name] = chosen or unquantized
    return out


def _modelopt(
    qc: Mapping[str, Any], field: str, unquantized: WeightFormat
) -> dict[str, WeightFormat]:
    body = qc.get("quantization", qc)
    if not isinstance(body, dict):
        raise ConfigProblems([f"{field}.quantization={_describe(body)}: expected an object"])
    algo = body.get("quant_algo")

    def fmt_of(algo: Any, group: Any, where: str) -> WeightFormat:
        if algo in ("NVFP4", "W4A16_NVFP4"):
            size = _size(group, f"{where}.group_size", 16)
            return WeightFormat(scheme="nvfp4", bits=4, group_size=size, scale_bytes=1)
        if algo in ("MXFP4", "W4A16_MXFP4"):
            return WeightFormat(scheme="mxfp4", bits=4, group_size=32, scale_bytes=1)
        if algo in ("FP8", "FP8_PER_CHANNEL_PER_TOKEN"):
            return WeightFormat(scheme="fp8_channel", bits=8)
        if algo == "FP8_BLOCK_SCALES":
            return WeightFormat(scheme="fp8_block", bits=8, group_size=128 * 128, scale_bytes=4)
        raise ConfigProblems(
            [f"{where}.quant_algo={_describe(algo)}: expected NVFP4, MXFP4 or FP8"]
        )

    excluded = _string_list(body, "exclude_modules", field) + _string_list(body, "ignore", field)
    out: dict[str, WeightFormat] = {}
    if algo == "MIXED_PRECISION":
        layers = body.get("quantized_layers")
        if not isinstance(layers, dict):
            raise ConfigProblems(
                [f"{field}.quantized_layers={_describe(layers)}: expected an object"]
            )
        for name, pattern in MIXED_PRECISION_KEYS.items():
            match = next(
                (v for k, v in layers.items() if isinstance(v, dict) and re.search(pattern, k)),
                None,
            )
            out[name] = (
                fmt_of(
                    match.get("quant_algo"), match.get("group_size"), f"{field}.quantized_layers"
                )
                if match
                else unquantized
            )
        return out
    fmt = fmt_of(algo, body.get("group_size"), field)
    for name in CLASS_MODULES:
        skipped = any(_glob(p, m) for p in excluded for m in _class_names(name))
        out[name] = unquantized if skipped else fmt
    return out


def _quark(qc: Mapping[str, Any], field: str, unquantized: WeightFormat) -> dict[str, WeightFormat]:
    global_config = qc.get("global_quant_config")
    if not isinstance(global_config, dict):
        raise ConfigProblems(
            [f"{field}.global_quant_config={_describe(global_config)}: expected an object"]
        )
    weight = global_config.get("weight")
    if isinstance(weight, list):  # several schemes stacked: the first is the storage one
        weight = weight[0] if weight else None
    if not isinstance(weight, dict):
        raise ConfigProblems(
            [f"{field}.global_quant_config.weight={_describe(weight)}: expected an object"]
        )
    dtype = weight.get("dtype")
    if dtype == "fp4" and weight.get("qscheme") == "per_group":
        fmt = WeightFormat(
            scheme="mxfp4",
            bits=4,
            group_size=_size(
                weight.get("group_size"), f"{field}.global_quant_config.weight.group_size", 32
            ),
            scale_bytes=1,
        )
    elif dtype == "fp8_e4m3":
        fmt = WeightFormat(scheme="fp8_channel", bits=8)
    elif dtype in ("int4", "uint4") and weight.get("qscheme") == "per_group":
        fmt = WeightFormat(
            scheme="int4_group",
            bits=4,
            group_size=_size(
                weight.get("group_size"), f"{field}.global_quant_config.weight.group_size", 32
            ),
            scale_bytes=2,
        )
    else:
        raise ConfigProblems(
            [
                f"{field}.global_quant_config.weight.dtype={_describe(dtype)}: cannot size "
                "this scheme; expected fp4 (per_group), fp8_e4m3 or int4 (per_group)"
            ]
        )
    excluded = _string_list(qc, "exclude", field)
    return {
        name: unquantized if any(_glob(p, m) for p in excluded for m in _class_names(name)) else fmt
        for name in CLASS_MODULES
    }


# ---------------------------------------------------------------- writing one


def config_json(spec: ModelSpec) -> dict[str, Any]:
    """A config.json of the model's form (flat, or text_config + vision_config for K2.5+)
    that `spec_from_config` reads back to the same numbers and weight formats."""
    numbers: dict[str, Any] = {k: getattr(spec, k) for k in ARCH_FIELDS}
    numbers["num_key_value_heads"] = spec.num_attention_heads
    text: dict[str, Any] = {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3" if spec.multimodal else spec.model_type,
        **numbers,
        "torch_dtype": "bfloat16",
        "quantization_config": _quantization_config(spec.quantization),
    }
    if spec.vision is None:
        return {**text, "architectures": list(spec.architectures)}
    v = spec.vision
    return {
        "architectures": list(spec.architectures),
        "model_type": spec.model_type,
        "torch_dtype": "bfloat16",
        "text_config": text,
        "quantization_config": text["quantization_config"],
        "vision_config": {
            "vt_hidden_size": v.hidden_size,
            "vt_num_hidden_layers": v.num_hidden_layers,
            "vt_intermediate_size": v.intermediate_size,
            "vt_num_attention_heads": 16,
            "patch_size": v.patch_size,
            "merge_kernel_size": list(v.merge_kernel),
            "init_pos_emb_height": v.pos_emb_height,
            "init_pos_emb_width": v.pos_emb_width,
            "mm_hidden_size": v.hidden_size,
            "text_hidden_size": spec.hidden_size,
        },
    }


def _quantization_config(q: Quantization) -> dict[str, Any]:
    experts = q.routed_experts
    if q.schemes() == {"fp8_block"}:
        side = round(experts.group_size**0.5)
        return {
            "quant_method": "fp8",
            "fmt": "e4m3",
            "activation_scheme": "dynamic",
            "weight_block_size": [side, side],
        }
    if experts.scheme == "int4_group" and {q.attention.scheme, q.dense_mlp.scheme} == {"bf16"}:
        return {
            "quant_method": "compressed-tensors",
            "format": "pack-quantized",
            "config_groups": {
                "group_0": {
                    "targets": ["Linear"],
                    "weights": {
                        "num_bits": 4,
                        "type": "int",
                        "strategy": "group",
                        "group_size": experts.group_size,
                        "symmetric": True,
                    },
                    "input_activations": None,
                }
            },
            "ignore": [
                "lm_head",
                "re:.*self_attn.*",
                "re:.*shared_experts.*",
                r"re:.*mlp\.(gate|up|gate_up|down)_proj.*",
            ],
        }
    raise ValueError(f"no config.json form for {q.label}")
