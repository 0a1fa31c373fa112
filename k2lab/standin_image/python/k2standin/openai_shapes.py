"""Non-streaming chat completions in the shapes the pinned engines return. Pure.

The stand-in "model" writes what Kimi-K2 writes (a thinking model's `<think>...</think>`, a
tool call in Kimi-K2's tool-call tokens); what the server makes of that text depends on the
flags it was launched with, as in the real engines:

- `--tool-call-parser kimi_k2` (vLLM: with `--enable-auto-tool-choice`; TensorRT-LLM:
  `--tool_parser kimi_k2`): the tool-call tokens become `message.tool_calls` and
  `finish_reason` "tool_calls". Without it the tokens stay in `content` (finish "stop").
- `--reasoning-parser kimi_k2` (TensorRT-LLM `--reasoning_parser`): the think block becomes
  `reasoning_content` (vLLM 0.33: `reasoning`). Without it the markers stay in `content`.

Read from the pinned wheels (docs/engines.md lists the files):
- SGLang 0.5.23 (serving_chat.py `_build_chat_response`, `_process_tool_call_id`,
  `_process_tool_calls`; function_call/kimik2_detector.py; parser/reasoning_parser.py
  KimiK2Detector): tool call `{"id": "functions.NAME:N", "index": i, "type": "function",
  "function": {"name", "arguments"}}` where N counts the conversation's earlier tool calls and
  arguments is the JSON text the model wrote; content is the text before the tool-call section,
  "" when none (never null); `reasoning_content` is null without reasoning; `tool_calls` is left
  out when there are none.
- vLLM 0.33.0 (parser/kimi_k2.py, entrypoints/openai/chat_completion/message_assembly.py and
  protocol.py, entrypoints/serve/utils/tool_calls_utils.py): the tool call's id is the model's
  own header `functions.NAME:N`, no `index`; content before the tool section is dropped when it
  is only whitespace (null); the reasoning field is `reasoning`; with the reasoning parser the
  parser starts inside reasoning, so text without `</think>` is all reasoning.
- TensorRT-LLM: no wheel of the pinned release is installed here; its stand-in follows the
  OpenAI shape with `reasoning_content` and ids `chatcmpl-tool-<hex>`.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from k2standin.common import scan

REPLY = "ready (stand-in)"
KIMI = "kimi_k2"
THINK_START, THINK_END = "<think>", "</think>"
SECTION_START = "<|tool_calls_section_begin|>"
SECTION_END = "<|tool_calls_section_end|>"
CALL_START = "<|tool_call_begin|>"
CALL_END = "<|tool_call_end|>"
ARG_START = "<|tool_call_argument_begin|>"
_CALL = re.compile(
    re.escape(CALL_START)
    + r"\s*(?P<id>[^\s<|]+)\s*"
    + re.escape(ARG_START)
    + r"\s*(?P<args>\{.*?\})\s*"
    + re.escape(CALL_END),
    re.DOTALL,
)
_ID = re.compile(r"^(?:functions\.)?(?P<name>[\w.\-]+):(?P<index>\d+)$")

# engine -> (tool-parser option, reasoning-parser option, option that turns auto tools on)
FLAG_NAMES: dict[str, tuple[str, str, str | None]] = {
    "sglang": ("--tool-call-parser", "--reasoning-parser", None),
    "vllm": ("--tool-call-parser", "--reasoning-parser", "--enable-auto-tool-choice"),
    "trtllm": ("--tool_parser", "--reasoning_parser", None),
}


@dataclass(frozen=True)
class ServerFlags:
    """What a chat answer's shape depends on: the engine, its parsers, the model."""

    engine: str
    tool_parser: str | None = None
    reasoning_parser: str | None = None
    auto_tools: bool = True
    """vLLM returns parsed tool calls for tool_choice "auto" only with
    --enable-auto-tool-choice."""
    thinking: bool = False
    """The served model thinks aloud (writes a `<think>` block before answering)."""


def thinks(model_path: str | None) -> bool:
    """Whether the checkpoint at `model_path` is a thinking model: Kimi-K2-Thinking (named so)
    or the K2.5 family (config.json model_type kimi_k25, thinking by default)."""
    if not model_path:
        return False
    path = Path(model_path)
    if "thinking" in path.name.lower():
        return True
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and config.get("model_type") == "kimi_k25"


def server_flags(engine: str, argv: Sequence[str], model_path: str | None) -> ServerFlags:
    """The flags of a server launched with `argv` (its options, after the program)."""
    tool_opt, reasoning_opt, auto_opt = FLAG_NAMES[engine]
    opts = scan(list(argv))
    return ServerFlags(
        engine=engine,
        tool_parser=opts.value(tool_opt) or None,
        reasoning_parser=opts.value(reasoning_opt) or None,
        auto_tools=auto_opt is None or opts.has(auto_opt),
        thinking=thinks(model_path),
    )


# ---------------------------------------------------------------- what the model writes


def _tools(request: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    tools = request.get("tools")
    if not isinstance(tools, list):
        return []
    return [t for t in tools if isinstance(t, Mapping) and isinstance(t.get("function"), Mapping)]


def _tool_choice(request: Mapping[str, Any]) -> Any:
    return request.get("tool_choice", "auto" if _tools(request) else "none")


def _last_user_text(messages: Any) -> str:
    for message in reversed(messages if isinstance(messages, list) else []):
        if isinstance(message, Mapping) and message.get("role") == "user":
            content = message.get("content")
            return content if isinstance(content, str) else ""
    return ""


def _earlier_calls(messages: Any) -> int:
    return sum(
        len(m.get("tool_calls") or [])
        for m in (messages if isinstance(messages, list) else [])
        if isinstance(m, Mapping) and m.get("role") == "assistant"
    )


def _proper_noun(text: str) -> str | None:
    """The first capitalised word that does not start a sentence ("Paris" in "What is the
    weather in Paris?")."""
    sentence_start = True
    for token in re.findall(r"[A-Za-z][\w'-]*|[.?!]", text):
        if token in ".?!":
            sentence_start = True
            continue
        if not sentence_start and token[0].isupper():
            return token
        sentence_start = False
    return None


def _argument(schema: Any, text: str) -> Any:
    kind = schema.get("type") if isinstance(schema, Mapping) else None
    if kind == "integer":
        return 1
    if kind == "number":
        return 1.0
    if kind == "boolean":
        return True
    return _proper_noun(text) or "stand-in"


def _call_arguments(function: Mapping[str, Any], text: str) -> dict[str, Any]:
    params = function.get("parameters")
    props = params.get("properties") if isinstance(params, Mapping) else None
    props = props if isinstance(props, Mapping) else {}
    required = params.get("required") if isinstance(params, Mapping) else None
    names = [n for n in (required or list(props)) if isinstance(n, str)]
    return {name: _argument(props.get(name), text) for name in names}


def model_text(request: Mapping[str, Any], thinking: bool) -> str:
    """What the stand-in model writes for `request`, in Kimi-K2's own tokens."""
    messages = request.get("messages")
    prompt = _last_user_text(messages)
    tools = _tools(request)
    choice = _tool_choice(request)
    function: Mapping[str, Any] | None = None
    if tools and choice != "none":
        function = tools[0]["function"]
        if isinstance(choice, Mapping):
            named = (choice.get("function") or {}).get("name")
            function = next(
                (t["function"] for t in tools if t["function"].get("name") == named), function
            )
    think = ""
    if thinking:
        plan = f"call {function.get('name')}" if function else "answer"
        think = f"{THINK_START}The user asks: {prompt[:60]!r}. I should {plan}.{THINK_END}"
    if function is None:
        return think + REPLY
    name = str(function.get("name"))
    args = json.dumps(_call_arguments(function, prompt), ensure_ascii=False)
    return (
        f"{think}{SECTION_START}{CALL_START}functions.{name}:{_earlier_calls(messages)}"
        f"{ARG_START}{args}{CALL_END}{SECTION_END}"
    )


# ---------------------------------------------------------------- what the server returns


@dataclass(frozen=True)
class Parsed:
    reasoning: str | None
    content: str
    calls: list[tuple[str, str, str]]
    """(the model's call id, function name, arguments JSON text) per call."""


def _split_reasoning(text: str, flags: ServerFlags) -> tuple[str | None, str]:
    if flags.reasoning_parser != KIMI:
        return None, text
    start = text.find(THINK_START)
    in_reasoning = start != -1 or flags.engine == "vllm"  # vLLM's parser starts in reasoning
    if not in_reasoning:
        return None, text
    body = text[start + len(THINK_START) :] if start != -1 else text
    end = body.find(THINK_END)
    if end != -1:
        return body[:end], body[end + len(THINK_END) :]
    section = body.find(SECTION_START)
    if section != -1:
        return body[:section], body[section:]
    return body, ""  # cut off while thinking: all of it is reasoning


def parse(text: str, request: Mapping[str, Any], flags: ServerFlags) -> Parsed:
    """The model's text as the server's parsers (per `flags`) split it."""
    reasoning, rest = _split_reasoning(text, flags)
    parsing = (
        flags.tool_parser == KIMI
        and flags.auto_tools
        and bool(_tools(request))
        and _tool_choice(request) != "none"
    )
    if not parsing or SECTION_START not in rest:
        return Parsed(reasoning, rest, [])
    calls = []
    for match in _CALL.finditer(rest):
        ident = match.group("id")
        found = _ID.match(ident)
        if found:
            calls.append((ident, found.group("name"), match.group("args")))
    return Parsed(reasoning, rest[: rest.find(SECTION_START)], calls)


def _sglang_message(parsed: Parsed, history: int) -> dict[str, Any]:
    message: dict[str, Any] = {
        "role": "assistant",
        "content": parsed.content or "",
        "reasoning_content": parsed.reasoning or None,
    }
    if parsed.calls:
        # serving_chat.py _process_tool_call_id: functions.{name}:{history + index} (kimi_k2)
        message["tool_calls"] = [
            {
                "id": f"functions.{name}:{history + i}",
                "index": i,
                "type": "function",
                "function": {"name": name, "arguments": args},
            }
            for i, (_, name, args) in enumerate(parsed.calls)
        ]
    return message


def _vllm_message(parsed: Parsed) -> dict[str, Any]:
    content: str | None = parsed.content
    if parsed.calls and not (content or "").strip():
        content = None  # drop_whitespace_only_content_before_tools
    message: dict[str, Any] = {
        "role": "assistant",
        "content": content if content or not parsed.reasoning else None,
        "refusal": None,
        "annotations": None,
        "audio": None,
        "function_call": None,
        "reasoning": parsed.reasoning,
    }
    if parsed.calls:
        message["tool_calls"] = [
            {"id": ident, "type": "function", "function": {"name": name, "arguments": args}}
            for ident, name, args in parsed.calls
        ]
    return message


def _trtllm_message(parsed: Parsed) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": parsed.content or None if parsed.calls else parsed.content,
        "reasoning_content": parsed.reasoning,
        "tool_calls": [
            {
                "id": f"chatcmpl-tool-{uuid.uuid4().hex}",
                "type": "function",
                "function": {"name": name, "arguments": args},
            }
            for _, name, args in parsed.calls
        ],
    }


def _usage(request: Mapping[str, Any], text: str) -> dict[str, int]:
    prompt = " ".join(
        str(m.get("content", "")) for m in request.get("messages") or [] if isinstance(m, Mapping)
    )
    prompt_tokens = max(1, len(prompt.split()))
    completion_tokens = max(1, len(text.split()))
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def chat_completion(
    request: Mapping[str, Any], flags: ServerFlags, model: str, *, ident: str, created: int
) -> dict[str, Any]:
    """The non-streaming answer of a server launched with `flags` to `request`."""
    text = model_text(request, flags.thinking)
    parsed = parse(text, request, flags)
    finish = "tool_calls" if parsed.calls else "stop"
    choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": finish}
    if flags.engine == "vllm":
        choice["message"] = _vllm_message(parsed)
        choice["stop_reason"] = None
    elif flags.engine == "trtllm":
        choice["message"] = _trtllm_message(parsed)
    else:
        choice["message"] = _sglang_message(parsed, _earlier_calls(request.get("messages")))
        choice["matched_stop"] = None
    return {
        "id": ident,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [choice],
        "usage": _usage(request, text),
    }
