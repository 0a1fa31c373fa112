"""The stand-in's chat answers (k2standin/openai_shapes.py): the shapes the pinned engines return,
as the launch flags make them, judged by the smoke test's own checks (k2provision/ops/smoke.py);
and the stand-in model's Kimi-K2 text through vLLM's real kimi_k2 parser."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from k2lab.standin import standin_dir
from k2provision.ops import smoke

sys.path.insert(0, str(standin_dir() / "python"))

from k2standin import openai_shapes as shapes

REPO = Path(__file__).resolve().parents[2]
TOOL = smoke.weather_tool()
ASK_TOOL: dict[str, Any] = {
    "model": "kimi-k2",
    "messages": [{"role": "user", "content": smoke.TOOL_PROMPT}],
    "tools": [TOOL],
    "tool_choice": "auto",
}
ASK_CHAT: dict[str, Any] = {
    "model": "kimi-k2",
    "messages": [{"role": "user", "content": "Reply with: ready"}],
}
SGLANG = shapes.ServerFlags("sglang", tool_parser="kimi_k2")
SGLANG_THINKING = shapes.ServerFlags(
    "sglang", tool_parser="kimi_k2", reasoning_parser="kimi_k2", thinking=True
)
VLLM_THINKING = shapes.ServerFlags(
    "vllm", tool_parser="kimi_k2", reasoning_parser="kimi_k2", thinking=True
)


def reply(request: dict[str, Any], flags: shapes.ServerFlags) -> dict[str, Any]:
    return shapes.chat_completion(request, flags, "kimi-k2", ident="chatcmpl-x", created=1)


def message(request: dict[str, Any], flags: shapes.ServerFlags) -> dict[str, Any]:
    doc: dict[str, Any] = reply(request, flags)["choices"][0]["message"]
    return doc


def test_sglang_with_the_tool_parser_returns_its_tool_call_shape() -> None:
    doc = reply(ASK_TOOL, SGLANG)
    choice = doc["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"] == {
        "role": "assistant",
        "content": "",
        "reasoning_content": None,
        "tool_calls": [
            {
                "id": "functions.get_weather:0",
                "index": 0,
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            }
        ],
    }
    assert smoke.check_tool_call(200, doc).ok


def test_sglang_numbers_a_call_after_the_conversations_earlier_calls() -> None:
    earlier = {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": "functions.get_weather:0",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'},
            }
        ],
    }
    request = {
        **ASK_TOOL,
        "messages": [
            ASK_TOOL["messages"][0],
            earlier,
            {"role": "tool", "tool_call_id": "functions.get_weather:0", "content": "sunny"},
            {"role": "user", "content": "And in Oslo?"},
        ],
    }
    call = message(request, SGLANG)["tool_calls"][0]
    assert call["id"] == "functions.get_weather:1"
    assert json.loads(call["function"]["arguments"]) == {"city": "Oslo"}


def test_a_plain_chat_has_no_tool_calls_key_and_stops() -> None:
    doc = reply(ASK_CHAT, SGLANG)
    assert doc["choices"][0]["finish_reason"] == "stop"
    assert doc["choices"][0]["message"] == {
        "role": "assistant",
        "content": shapes.REPLY,
        "reasoning_content": None,
    }
    assert doc["usage"]["total_tokens"] > 0
    assert smoke.check_chat(200, doc).ok


@pytest.mark.parametrize("engine", ["sglang", "vllm", "trtllm"])
def test_without_the_tool_parser_the_raw_tokens_come_back_and_verify_fails(engine: str) -> None:
    doc = reply(ASK_TOOL, shapes.ServerFlags(engine))
    msg = doc["choices"][0]["message"]
    assert "<|tool_calls_section_begin|>" in msg["content"]
    assert not msg.get("tool_calls")
    assert doc["choices"][0]["finish_reason"] == "stop"
    check = smoke.check_tool_call(200, doc)
    assert not check.ok
    assert "tool-call parser kimi_k2 is missing" in check.problems[0]


def test_vllm_without_auto_tool_choice_returns_raw_text() -> None:
    flags = shapes.ServerFlags("vllm", tool_parser="kimi_k2", auto_tools=False)
    assert not smoke.check_tool_call(200, reply(ASK_TOOL, flags)).ok


def test_vllm_shape_native_id_no_index_reasoning_field() -> None:
    doc = reply(ASK_TOOL, VLLM_THINKING)
    msg = doc["choices"][0]["message"]
    assert msg["tool_calls"] == [
        {
            "id": "functions.get_weather:0",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
        }
    ]
    assert msg["content"] is None
    assert msg["reasoning"].startswith("The user asks")
    assert "reasoning_content" not in msg
    assert doc["choices"][0]["finish_reason"] == "tool_calls"
    assert smoke.check_tool_call(200, doc).ok


@pytest.mark.parametrize("flags", [SGLANG_THINKING, VLLM_THINKING])
def test_a_thinking_model_with_the_reasoning_parser_passes(flags: shapes.ServerFlags) -> None:
    doc = reply(ASK_CHAT, flags)
    check = smoke.check_chat(200, doc, thinking=True)
    assert check.ok, check.problems
    assert check.content == shapes.REPLY
    assert check.reasoning
    assert "<think>" not in check.reasoning


def test_a_thinking_model_without_the_reasoning_parser_fails() -> None:
    flags = shapes.ServerFlags("sglang", tool_parser="kimi_k2", thinking=True)
    chat = smoke.check_chat(200, reply(ASK_CHAT, flags), thinking=True)
    assert not chat.ok
    assert "think marker" in chat.problems[0]
    assert not smoke.check_tool_call(200, reply(ASK_TOOL, flags)).ok


def test_trtllm_shape() -> None:
    flags = shapes.ServerFlags("trtllm", tool_parser="kimi_k2")
    msg = message(ASK_TOOL, flags)
    assert msg["tool_calls"][0]["id"].startswith("chatcmpl-tool-")
    assert msg["tool_calls"][0]["function"]["name"] == "get_weather"
    assert smoke.check_tool_call(200, reply(ASK_TOOL, flags)).ok


def test_tool_choice_none_and_a_named_tool() -> None:
    assert "tool_calls" not in message({**ASK_TOOL, "tool_choice": "none"}, SGLANG)
    other = smoke.weather_tool("get_time", "zone")
    named = {
        **ASK_TOOL,
        "tools": [TOOL, other],
        "tool_choice": {"type": "function", "function": {"name": "get_time"}},
    }
    call = message(named, SGLANG)["tool_calls"][0]["function"]
    assert call["name"] == "get_time"
    assert json.loads(call["arguments"]) == {"zone": "Paris"}


def test_flags_are_read_from_each_engines_command_line(tmp_path: Path) -> None:
    thinking = tmp_path / "Kimi-K2-Thinking"
    thinking.mkdir()
    k25 = tmp_path / "k25"
    k25.mkdir()
    (k25 / "config.json").write_text('{"model_type": "kimi_k25"}')
    sglang = shapes.server_flags(
        "sglang",
        [
            "--model-path",
            str(thinking),
            "--tool-call-parser",
            "kimi_k2",
            "--reasoning-parser",
            "kimi_k2",
        ],
        str(thinking),
    )
    assert sglang == SGLANG_THINKING
    vllm = shapes.server_flags("vllm", [str(k25), "--tool-call-parser", "kimi_k2"], str(k25))
    assert (vllm.tool_parser, vllm.auto_tools, vllm.thinking) == ("kimi_k2", False, True)
    trt = shapes.server_flags("trtllm", [str(tmp_path), "--tool_parser", "kimi_k2"], None)
    assert (trt.tool_parser, trt.reasoning_parser, trt.thinking) == ("kimi_k2", None, False)


VLLM_PARSE = """
import json, sys
from vllm.parser.kimi_k2 import KimiK2Parser
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
TOKENS = ["<think>", "</think>", "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>",
          "<|tool_call_begin|>", "<|tool_call_end|>", "<|tool_call_argument_begin|>"]
class Vocab:  # the parser reads only the special tokens' ids from the tokenizer
    def get_vocab(self):
        return {t: 163000 + i for i, t in enumerate(TOKENS)}
doc = json.load(sys.stdin)
request = ChatCompletionRequest.model_validate(doc["request"])
parser = KimiK2Parser(Vocab(), request.tools)
reasoning, _ = parser.extract_reasoning(doc["text"], request)
info = parser.extract_tool_calls(doc["text"], request)
print(json.dumps({"reasoning": reasoning, "content": info.content,
                  "calls": [c.model_dump() for c in info.tool_calls]}))
"""


@pytest.mark.parsers
def test_vllms_real_kimi_k2_parser_reads_the_stand_in_models_text_as_the_stand_in_does() -> None:
    python = REPO / ".venv-vllm" / "bin" / "python"
    if not python.exists():
        pytest.fail(f"{python} is missing: run scripts/install-engine-parsers")
    text = shapes.model_text(ASK_TOOL, thinking=True)
    out = subprocess.run(
        [str(python), "-c", VLLM_PARSE],
        input=json.dumps({"request": ASK_TOOL, "text": text}),
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    real = json.loads(out.stdout)
    ours = message(ASK_TOOL, VLLM_THINKING)
    assert real["reasoning"] == ours["reasoning"]
    assert real["content"] == ours["content"]
    assert [
        {
            "id": c["id"],
            "type": c["type"],
            "function": {"name": c["function"]["name"], "arguments": c["function"]["arguments"]},
        }
        for c in real["calls"]
    ] == ours["tool_calls"]


@pytest.mark.parametrize(
    ("example", "model"),
    [
        ("sglang-tp", "moonshotai/Kimi-K2-Thinking"),
        ("vllm-tp", "moonshotai/Kimi-K2-Thinking"),
        ("vllm-tp", "moonshotai/Kimi-K2.5"),
        # TensorRT-LLM serves no thinking Kimi checkpoint here (the catalog refuses it).
        ("trtllm-tp-ep", "moonshotai/Kimi-K2-Instruct"),
    ],
)
def test_a_rendered_plan_passes_and_fails_without_its_parser_flags(
    example: str, model: str, tmp_path: Path
) -> None:
    """The serving command lines a plan renders, read as the stand-in reads them: their answers
    pass the smoke test; the same command without the tool-call parser, or (a thinking model)
    without the reasoning parser, fails it."""
    from dataclasses import replace

    from k2provision.plan.assemble import build_plan
    from k2provision.plan.inventory import load_cluster

    inventory = tmp_path / f"{example}.ini"
    source = (REPO / "inventory" / "examples" / f"{example}.ini").read_text()
    inventory.write_text(f"{source}k2_model={model}\n")
    plan = build_plan(load_cluster(inventory))
    thinking = smoke.expectation(plan.model).thinking
    assert thinking == ("Instruct" not in model)
    engine = str(plan.engine)
    tool_opt, reasoning_opt, _ = shapes.FLAG_NAMES[engine]
    servers = [p.argv for h in plan.hosts for p in h.processes if tool_opt in p.argv]
    assert servers, "no serving process rendered"
    for argv in servers:
        flags = replace(shapes.server_flags(engine, argv, None), thinking=thinking)
        assert smoke.check_chat(200, reply(ASK_CHAT, flags), thinking=thinking).ok
        assert smoke.check_tool_call(200, reply(ASK_TOOL, flags)).ok
        assert (reasoning_opt in argv) == thinking
        for dropped in (tool_opt, reasoning_opt) if thinking else (tool_opt,):
            at = argv.index(dropped)
            less = replace(
                shapes.server_flags(engine, [*argv[:at], *argv[at + 2 :]], None),
                thinking=thinking,
            )
            chat = smoke.check_chat(200, reply(ASK_CHAT, less), thinking=thinking)
            tool = smoke.check_tool_call(200, reply(ASK_TOOL, less))
            assert not (chat.ok and tool.ok), f"{engine} without {dropped} passed"
