"""The smoke test's judgement of an endpoint's answers (k2provision/ops/smoke.py) and the k2_verify
role's filters over it (k2.cluster.smoke_*)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from k2provision.ansible.collections.ansible_collections.k2.cluster.plugins.filter import (
    smoke as smoke_filters,
)
from k2provision.ops import smoke

HOST = "decode-0"
URL = "http://10.82.0.10:8000/v1/chat/completions"


def answer(message: dict[str, Any], finish: str = "stop") -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": "kimi-k2",
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
    }


def tool_message(
    arguments: Any = '{"city": "Paris"}', name: str = "get_weather", **extra: Any
) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": "functions.get_weather:0",
                "index": 0,
                "type": "function",
                "function": {"name": name, "arguments": arguments},
            }
        ],
        **extra,
    }


RAW_CALL = (
    "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
    '<|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|><|tool_calls_section_end|>'
)


def test_a_parsed_tool_call_passes_and_is_named() -> None:
    check = smoke.check_tool_call(200, answer(tool_message(), "tool_calls"))
    assert check.ok, check.problems
    assert check.tool_call is not None
    assert str(check.tool_call) == 'get_weather({"city": "Paris"}) [id functions.get_weather:0]'


def test_arguments_as_an_object_pass_too() -> None:
    check = smoke.check_tool_call(200, answer(tool_message({"city": "Paris"})))
    assert check.ok, check.problems


def test_no_tool_calls_fails() -> None:
    check = smoke.check_tool_call(200, answer({"role": "assistant", "content": "It is sunny."}))
    assert not check.ok
    assert check.problems == ("no tool_calls in the message",)


def test_the_raw_tool_call_tokens_in_content_fail_naming_the_parser() -> None:
    check = smoke.check_tool_call(200, answer({"role": "assistant", "content": RAW_CALL}))
    assert not check.ok
    assert "tool-call parser kimi_k2 is missing" in check.problems[0]


def test_arguments_that_are_not_json_fail() -> None:
    check = smoke.check_tool_call(200, answer(tool_message('{"city": Paris')))
    assert not check.ok
    assert "are not JSON" in check.problems[0]


def test_arguments_that_are_json_but_not_an_object_fail() -> None:
    check = smoke.check_tool_call(200, answer(tool_message('["Paris"]')))
    assert "are not a JSON object" in check.problems[0]


def test_a_missing_required_key_fails() -> None:
    check = smoke.check_tool_call(200, answer(tool_message('{"town": "Paris"}')))
    assert not check.ok
    assert "lack the required city" in check.problems[0]


def test_another_function_fails() -> None:
    check = smoke.check_tool_call(200, answer(tool_message(name="get_time")))
    assert check.problems == ("tool_calls[0] names 'get_time', not 'get_weather'",)


def test_reasoning_leaked_into_content_fails() -> None:
    leaked = {"role": "assistant", "content": "<think>Paris, so...</think>It is sunny."}
    chat = smoke.check_chat(200, answer(leaked), thinking=True)
    assert not chat.ok
    assert any("think marker(s) <think>, </think>" in p for p in chat.problems)
    assert any("no reasoning_content" in p for p in chat.problems)
    tool = smoke.check_tool_call(200, answer(tool_message(content="<think>x</think>")))
    assert not tool.ok
    assert "reasoning parser kimi_k2 is missing" in tool.problems[0]


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
def test_reasoning_apart_from_the_content_passes(field: str) -> None:
    message = {"role": "assistant", "content": "ready", field: "The user wants one word."}
    check = smoke.check_chat(200, answer(message), thinking=True)
    assert check.ok, check.problems
    assert check.reasoning == "The user wants one word."


def test_a_thinking_model_cut_off_while_thinking_passes() -> None:
    message = {"role": "assistant", "content": "", "reasoning_content": "The user"}
    assert smoke.check_chat(200, answer(message), thinking=True).ok


def test_an_instruct_model_needs_no_reasoning() -> None:
    assert smoke.check_chat(200, answer({"role": "assistant", "content": "ready"})).ok


def test_an_error_body_fails_with_its_message() -> None:
    body = {"object": "error", "message": "The model `x` does not exist.", "code": 404}
    check = smoke.check_tool_call(404, body)
    assert check.problems == ("HTTP 404: The model `x` does not exist.",)
    nested = smoke.check_chat(400, {"error": {"message": "tools: bad schema"}})
    assert nested.problems == ("HTTP 400: tools: bad schema",)


def test_a_body_that_is_not_json_and_no_choices_fail() -> None:
    assert smoke.check_chat(200, "<html>bad gateway</html>").problems == (
        "the body is not a JSON object",
    )
    assert smoke.check_chat(200, {"choices": []}).problems == ("no choices",)
    assert smoke.check_chat(-1, "").problems == ("no HTTP answer",)


def test_json_text_is_read_as_json() -> None:
    assert smoke.check_tool_call(200, json.dumps(answer(tool_message()))).ok


def test_the_failure_message_names_host_endpoint_answer_expectation_and_fix() -> None:
    body = answer({"role": "assistant", "content": RAW_CALL + "x" * 1000})
    check = smoke.check_tool_call(200, body)
    message = smoke.failure_message(HOST, URL, "tool", check, thinking=False)
    assert message.startswith(f"{HOST}: POST {URL} (a chat completion with tools) answered ")
    assert "<|tool_call_begin|>functions.get_weather:0" in message  # what came back
    assert "..." in message
    assert len(check.shown) == smoke.SHOWN_CHARS
    assert "expected 200 with message.tool_calls[0] naming get_weather" in message
    assert "--tool-call-parser kimi_k2" in message


def test_the_weather_tool_requires_its_parameter() -> None:
    tool = smoke.weather_tool("lookup", "town")
    assert tool["function"]["name"] == "lookup"
    assert tool["function"]["parameters"]["required"] == ["town"]


@pytest.mark.parametrize(
    ("model", "thinking"),
    [
        ("moonshotai/Kimi-K2-Instruct", False),
        ("moonshotai/Kimi-K2-Thinking", True),
        ("moonshotai/Kimi-K2.5", True),
    ],
)
def test_thinking_models_are_known_from_the_catalog(model: str, thinking: bool) -> None:
    wanted = smoke_filters.smoke_expectation({"model": model})
    assert wanted["thinking"] is thinking
    assert wanted["tool_parser"] == "kimi_k2"
    assert wanted["reasoning_parser"] == ("kimi_k2" if thinking else None)


def test_the_filter_judges_a_uri_result() -> None:
    ok = smoke_filters.smoke_check(
        {"status": 200, "json": answer(tool_message())}, "tool", HOST, URL
    )
    assert ok["ok"] is True
    assert ok["message"] == ""
    assert ok["tool_call"]["name"] == "get_weather"
    assert ok["tool_call"]["text"].startswith("get_weather(")
    # sglang-router types some JSON text/plain: uri leaves .json unset, the content holds it.
    plain = smoke_filters.smoke_check(
        {"status": 200, "content": json.dumps(answer(tool_message()))}, "tool", HOST, URL
    )
    assert plain["ok"] is True
    refused = smoke_filters.smoke_check(
        {"status": -1, "msg": "Status code was -1: Connection refused"}, "chat", HOST, URL
    )
    assert refused["ok"] is False
    assert "Connection refused" in refused["message"]
    assert refused["message"].startswith(f"{HOST}: POST {URL}")
    with pytest.raises(ValueError, match="expected chat or tool"):
        smoke_filters.smoke_check({"status": 200}, "stream", HOST, URL)


def test_verify_shows_the_tool_call_or_what_was_wrong() -> None:
    from k2provision.commands.verify import answer_lines

    good = {
        "chat": smoke_filters.smoke_check(
            {
                "status": 200,
                "json": answer(
                    {"role": "assistant", "content": "ready", "reasoning_content": "one word"}
                ),
            },
            "chat",
            HOST,
            URL,
            True,
        ),
        "tool": smoke_filters.smoke_check(
            {"status": 200, "json": answer(tool_message())}, "tool", HOST, URL
        ),
    }
    lines = [line.plain for line in answer_lines(good)]
    assert lines == [
        "chat: ok reply 'ready'",
        "reasoning: 8 characters, apart from the content",
        'tool call: ok get_weather({"city": "Paris"}) [id functions.get_weather:0]',
    ]
    wrong = {
        **good,
        "tool": smoke_filters.smoke_check(
            {"status": 200, "json": answer({"role": "assistant", "content": RAW_CALL})},
            "tool",
            HOST,
            URL,
        ),
    }
    lines = [line.plain for line in answer_lines(wrong)]
    assert lines[2] == "tool call: wrong none"
    assert lines[3].startswith(f"{HOST}: POST {URL} (a chat completion with tools) answered")
    unkeyed = [line.plain for line in answer_lines({**good, "keyless": None})]
    assert unkeyed == [line.plain for line in answer_lines(good)]  # no key set: no line
    keyed = [line.plain for line in answer_lines({**good, "keyless": 401})]
    assert keyed[3] == "without the API key: ok HTTP 401"
    open_ = [line.plain for line in answer_lines({**good, "keyless": 200})]
    assert open_[3] == "without the API key: wrong HTTP 200"
