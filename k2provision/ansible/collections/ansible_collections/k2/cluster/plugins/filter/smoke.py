"""Filters of the k2_verify role (k2.cluster.smoke_*): the tool definition, what the served
model's answers must look like, and the judgement of an answer (k2provision/ops/smoke.py)."""

from __future__ import annotations

from typing import Any

from k2provision.core.inventory import plain_value
from k2provision.ops import smoke


def smoke_tool(name: str, parameter: str) -> dict[str, Any]:
    """The `tools` entry of the smoke test: function `name` with one required string
    `parameter`."""
    return smoke.weather_tool(name, parameter)


def smoke_expectation(plan: dict[str, Any]) -> dict[str, Any]:
    """{thinking, tool_parser, reasoning_parser} of the plan's model (from the catalog)."""
    wanted = smoke.expectation(str(plan["model"]))
    return {
        "thinking": wanted.thinking,
        "tool_parser": wanted.tool_parser,
        "reasoning_parser": wanted.reasoning_parser,
    }


def smoke_check(
    result: dict[str, Any],
    kind: str,
    host: str,
    url: str,
    thinking: bool = False,
    function: str = smoke.TOOL_NAME,
    parameter: str = smoke.TOOL_PARAMETER,
) -> dict[str, Any]:
    """Judge a `uri` result of the smoke test. `kind` is "chat" (a plain chat completion) or
    "tool" (one asked with tools). Returns {ok, message, content, reasoning, tool_call}; the
    message names host, endpoint, what came back, what was expected and the fix."""
    status = int(result.get("status") or -1)
    body: Any = result["json"] if "json" in result else result.get("content")
    if status <= 0 or body in (None, ""):
        body = body or result.get("msg") or ""
    if kind == "tool":
        check = smoke.check_tool_call(status, body, function=function, required=(parameter,))
    elif kind == "chat":
        check = smoke.check_chat(status, body, thinking=thinking)
    else:
        raise ValueError(f"smoke_check kind {kind!r}: expected chat or tool")
    call = check.tool_call
    return {
        "ok": check.ok,
        "message": ""
        if check.ok
        else smoke.failure_message(
            host, url, kind, check, thinking=thinking, function=function, required=(parameter,)
        ),
        "content": check.content,
        "reasoning": check.reasoning,
        "tool_call": None
        if call is None
        else {"id": call.id, "name": call.name, "arguments": call.arguments, "text": str(call)},
    }


def _plain_args(func: Any) -> Any:
    """Wrap a filter so it sees plain dicts and lists, not Ansible's lazily templated ones."""

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return func(
            *(plain_value(a) for a in args), **{k: plain_value(v) for k, v in kwargs.items()}
        )

    wrapper.__name__ = func.__name__
    wrapper.__doc__ = func.__doc__
    return wrapper


class FilterModule:
    """Ansible's entry point for filter plugins."""

    def filters(self) -> dict[str, Any]:
        funcs = (smoke_tool, smoke_expectation, smoke_check)
        return {f.__name__: _plain_args(f) for f in funcs}
