"""The smoke test's tool definition and the checks of the endpoint's answers. Pure.

The verify phase (roles/k2_verify, through the k2.cluster.smoke_check filter) and
`k2provision verify` ask the endpoint for a plain chat completion and for one with a `tools`
definition; these functions judge what came back. A tool call must come back parsed, in
`message.tool_calls` (what the engines' `kimi_k2` tool-call parser does), never as Kimi-K2's
raw tool-call tokens in `content`. A thinking model's reasoning must come back apart from the
answer (the engines' `kimi_k2` reasoning parser): in `reasoning_content` (SGLang, TensorRT-LLM)
or `reasoning` (vLLM 0.33), with no think markers left in `content`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from k2provision.core import catalog

TOOL_NAME = "get_weather"
TOOL_PARAMETER = "city"
TOOL_PROMPT = "What is the weather in Paris right now? Use the get_weather tool."
THINK_MARKERS = ("<think>", "</think>", "◁think▷", "◁/think▷")
TOOL_MARKERS = (
    "<|tool_calls_section_begin|>",
    "<|tool_call_begin|>",
    "<|tool_call_argument_begin|>",
)
REASONING_FIELDS = ("reasoning_content", "reasoning")
SHOWN_CHARS = 400


def weather_tool(name: str = TOOL_NAME, parameter: str = TOOL_PARAMETER) -> dict[str, Any]:
    """An OpenAI `tools` entry: one function with one required string parameter."""
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": f"Current weather for a {parameter}.",
            "parameters": {
                "type": "object",
                "properties": {parameter: {"type": "string", "description": f"The {parameter}."}},
                "required": [parameter],
            },
        },
    }


@dataclass(frozen=True)
class Expectation:
    """What the served model's answers must look like."""

    thinking: bool
    """The model thinks aloud: its reasoning must come back separated."""
    tool_parser: str | None
    reasoning_parser: str | None


def expectation(model_id: str) -> Expectation:
    """The served model's parsers, from the catalog (a thinking model has a reasoning parser)."""
    spec = catalog.model(model_id)
    return Expectation(
        thinking=spec.reasoning_parser is not None,
        tool_parser=spec.tool_parser,
        reasoning_parser=spec.reasoning_parser,
    )


@dataclass(frozen=True)
class ToolCallSeen:
    """The first tool call of an answer, as it came back."""

    id: str
    name: str
    arguments: str

    def __str__(self) -> str:
        return f"{self.name}({self.arguments}) [id {self.id}]"


@dataclass(frozen=True)
class ChatCheck:
    """One answer judged: what is wrong with it (nothing: ok) and what it said."""

    problems: tuple[str, ...]
    shown: str
    """What came back (the first choice, else the body), truncated, for messages."""
    content: str = ""
    reasoning: str | None = None
    tool_call: ToolCallSeen | None = None

    @property
    def ok(self) -> bool:
        """True when nothing is wrong."""
        return not self.problems


def shown(body: Any, limit: int = SHOWN_CHARS) -> str:
    """`body` as compact text, cut to `limit` characters."""
    text = body if isinstance(body, str) else json.dumps(body, ensure_ascii=False)
    text = " ".join(text.split())
    return text if len(text) <= limit else f"{text[: limit - 3]}..."


def shown_answer(body: Any, limit: int = SHOWN_CHARS) -> str:
    """What came back, for messages: the first choice (its message and finish reason) where
    there is one, else the whole body; cut to `limit` characters."""
    if isinstance(body, Mapping):
        choices = body.get("choices")
        if isinstance(choices, list) and choices and isinstance(choices[0], Mapping):
            first = choices[0]
            return shown(
                {"message": first.get("message"), "finish_reason": first.get("finish_reason")},
                limit,
            )
    return shown(body, limit)


def parse_body(body: Any) -> Any:
    """A response body as JSON: a string is parsed (the router types some JSON text/plain);
    text that is not JSON stays text."""
    if isinstance(body, (bytes, bytearray)):
        body = body.decode(errors="replace")
    if isinstance(body, str):
        try:
            return json.loads(body)
        except ValueError:
            return body
    return body


def _message(status: int, body: Any) -> tuple[Mapping[str, Any] | None, list[str]]:
    """The first choice's message, or why there is none."""
    if status != 200:
        what = f"HTTP {status}" if status > 0 else "no HTTP answer"
        if isinstance(body, Mapping) and isinstance(body.get("error"), Mapping):
            body = body["error"]
        if isinstance(body, Mapping) and body.get("message"):
            return None, [f"{what}: {body['message']}"]
        return None, [what]
    if not isinstance(body, Mapping):
        return None, ["the body is not a JSON object"]
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], Mapping):
        return None, ["no choices"]
    message = choices[0].get("message")
    if not isinstance(message, Mapping):
        return None, ["choices[0] has no message"]
    return message, []


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _reasoning(message: Mapping[str, Any]) -> str | None:
    for field in REASONING_FIELDS:
        value = message.get(field)
        if isinstance(value, str) and value.strip():
            return value
    return None


def reasoning_problems(message: Mapping[str, Any], *, thinking: bool) -> list[str]:
    """What is wrong with where the reasoning went."""
    content = _text(message.get("content"))
    problems = []
    leaked = [m for m in THINK_MARKERS if m in content]
    if leaked:
        problems.append(
            f"content holds the think marker(s) {', '.join(leaked)}: the reasoning was not "
            "separated (the engine's reasoning parser kimi_k2 is missing)"
        )
    if thinking and _reasoning(message) is None:
        problems.append(
            "no reasoning_content (or reasoning) for a thinking model: the engine's reasoning "
            "parser kimi_k2 is missing"
        )
    return problems


def check_chat(status: int, body: Any, *, thinking: bool = False) -> ChatCheck:
    """A plain chat completion: 200, a message, and the reasoning separated."""
    body = parse_body(body)
    message, problems = _message(status, body)
    if message is None:
        return ChatCheck(tuple(problems), shown_answer(body))
    problems = reasoning_problems(message, thinking=thinking)
    content = _text(message.get("content"))
    if not content.strip() and _reasoning(message) is None and not message.get("tool_calls"):
        problems.append("the message is empty (no content, reasoning or tool call)")
    return ChatCheck(tuple(problems), shown_answer(body), content, _reasoning(message))


def _arguments_problem(arguments: Any, required: Sequence[str]) -> tuple[str, str | None]:
    """(the arguments as text, what is wrong with them or None)."""
    if isinstance(arguments, Mapping):
        parsed: Any = arguments
        text = json.dumps(arguments, ensure_ascii=False)
    elif isinstance(arguments, str):
        text = arguments
        try:
            parsed = json.loads(arguments)
        except ValueError as error:
            return text, f"its arguments {shown(arguments, 80)!r} are not JSON ({error})"
    else:
        return json.dumps(arguments), f"its arguments are {type(arguments).__name__}, not JSON"
    if not isinstance(parsed, Mapping):
        return text, f"its arguments {shown(text, 80)} are not a JSON object"
    missing = [key for key in required if key not in parsed]
    if missing:
        return text, f"its arguments {shown(text, 80)} lack the required {', '.join(missing)}"
    return text, None


def check_tool_call(
    status: int,
    body: Any,
    *,
    function: str = TOOL_NAME,
    required: Sequence[str] = (TOOL_PARAMETER,),
) -> ChatCheck:
    """A chat completion asked with `tools`: its first tool call names `function` with JSON
    object arguments holding every `required` key, and no raw tool-call or think tokens are
    left in the content."""
    body = parse_body(body)
    message, problems = _message(status, body)
    if message is None:
        return ChatCheck(tuple(problems), shown_answer(body))
    content = _text(message.get("content"))
    # A thinking model may go straight to the call: only leaked think markers are wrong here.
    problems = reasoning_problems(message, thinking=False)
    raw = [m for m in TOOL_MARKERS if m in content]
    calls = message.get("tool_calls")
    seen: ToolCallSeen | None = None
    if not isinstance(calls, list) or not calls:
        why = (
            "the tool call came back as raw text in content (the engine's tool-call parser "
            "kimi_k2 is missing)"
            if raw
            else "no tool_calls in the message"
        )
        problems.append(why)
    else:
        call = calls[0]
        fn = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(fn, Mapping):
            problems.append("tool_calls[0] has no function")
        else:
            name = _text(fn.get("name"))
            text, wrong = _arguments_problem(fn.get("arguments"), required)
            seen = ToolCallSeen(_text(call.get("id")), name, text)
            if name != function:
                problems.append(f"tool_calls[0] names {name or 'no function'!r}, not {function!r}")
            if wrong:
                problems.append(f"tool_calls[0] {wrong}")
            if call.get("type", "function") != "function":
                problems.append(f"tool_calls[0] has type {call.get('type')!r}, not 'function'")
        if raw:
            problems.append(f"content still holds the tool-call token(s) {', '.join(raw)}")
    return ChatCheck(tuple(problems), shown_answer(body), content, _reasoning(message), seen)


def expected_text(
    kind: str,
    *,
    thinking: bool,
    function: str = TOOL_NAME,
    required: Sequence[str] = (TOOL_PARAMETER,),
) -> str:
    """What a good answer of `kind` ("chat" or "tool") looks like, in words."""
    if kind == "tool":
        return (
            f"200 with message.tool_calls[0] naming {function} with arguments that parse as a "
            f"JSON object holding {', '.join(required)}, and no raw tool-call or think tokens "
            "in content"
        )
    if thinking:
        return (
            "200 with a message, the reasoning in reasoning_content and no think markers in content"
        )
    return "200 with a message"


def failure_message(
    host: str,
    url: str,
    kind: str,
    check: ChatCheck,
    *,
    thinking: bool,
    function: str = TOOL_NAME,
    required: Sequence[str] = (TOOL_PARAMETER,),
) -> str:
    """One message for a wrong answer: host, endpoint, what came back, what was expected, fix."""
    asked = "a chat completion with tools" if kind == "tool" else "a chat completion"
    fix = (
        "render the plan (`k2provision render`) and check the engine command carries the model's "
        "parsers (--tool-call-parser kimi_k2, vLLM also --enable-auto-tool-choice; for a thinking "
        "model --reasoning-parser kimi_k2), then launch again; read the engine's log "
        "(`k2provision logs`) for errors"
    )
    return (
        f"{host}: POST {url} ({asked}) answered {check.shown}; problem: "
        f"{'; '.join(check.problems)}; expected "
        f"{expected_text(kind, thinking=thinking, function=function, required=required)}; "
        f"fix: {fix}"
    )
