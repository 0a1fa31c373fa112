"""The stand-in's lab fault modes (K2_LAB_FAULT), parsed and run from the source tree."""

from __future__ import annotations

import json
import sys

import pytest

from tests.k2lab import test_standin as st

sys.path.insert(0, str(st.STANDIN / "python"))
from k2standin import faults  # the image's package, from its source tree

env = st.env
procs = st.procs


@pytest.mark.parametrize(
    ("text", "mode", "seconds"),
    [
        ("exit_at_start", "exit_at_start", 0.0),
        ("never_healthy", "never_healthy", 0.0),
        ("wrong_answer", "wrong_answer", 0.0),
        ("die_after=20", "die_after", 20.0),
        (" die_after=2.5 ", "die_after", 2.5),
        ("slow=1.5", "slow", 1.5),
    ],
)
def test_parse_names_each_mode(text: str, mode: str, seconds: float) -> None:
    fault = faults.parse(text)
    assert fault is not None
    assert (fault.mode, fault.seconds) == (mode, seconds)


@pytest.mark.parametrize("text", [None, "", "  "])
def test_parse_unset_is_no_fault(text: str | None) -> None:
    assert faults.parse(text) is None


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("crash", "expected exit_at_start, never_healthy, wrong_answer, die_after=<seconds> or"),
        ("die_after", "die_after needs a number of seconds > 0"),
        ("die_after=0", "die_after needs a number of seconds > 0"),
        ("die_after=soon", "die_after needs a number of seconds > 0"),
        ("never_healthy=1", "expected exit_at_start"),
        ("slow", "slow needs a number of seconds > 0"),
    ],
)
def test_parse_refuses_what_is_not_a_fault(text: str, named: str) -> None:
    with pytest.raises(ValueError, match="K2_LAB_FAULT") as caught:
        faults.parse(text)
    assert named in str(caught.value)


def test_exit_at_start_writes_one_error_line_and_exits_1(env: st.Env) -> None:
    out = st.run(env, st.sglang_argv(env, st.free_port()), {"K2_LAB_FAULT": "exit_at_start"})
    assert out.returncode == 1
    errors = [line for line in out.stderr.splitlines() if "error:" in line]
    assert errors == [
        "k2-standin sglang.launch_server: error: fault injected "
        "(K2_LAB_FAULT=exit_at_start): exiting 1 at start"
    ]


def test_a_bad_fault_refuses_to_start(env: st.Env) -> None:
    out = st.run(env, st.sglang_argv(env, st.free_port()), {"K2_LAB_FAULT": "sometimes"})
    assert out.returncode == 2
    assert "K2_LAB_FAULT='sometimes': expected exit_at_start" in out.stderr


def test_never_healthy_serves_but_every_health_route_is_503(
    env: st.Env, procs: list[st.Proc]
) -> None:
    port = st.free_port()
    proc = st.start(procs, env, st.sglang_argv(env, port), {"K2_LAB_FAULT": "never_healthy"})
    base = f"http://127.0.0.1:{port}"
    st.wait_status(f"{base}/liveness", proc)
    for path in ("/health", "/health_generate", "/readiness"):
        status, body = st.http(f"{base}{path}")
        assert status == 503, path
        assert b"never healthy" in body
    assert st.http(f"{base}/v1/models")[0] == 200  # it serves; only its health is bad


def test_wrong_answer_is_a_200_without_choices(env: st.Env, procs: list[st.Proc]) -> None:
    port = st.free_port()
    proc = st.start(procs, env, st.sglang_argv(env, port), {"K2_LAB_FAULT": "wrong_answer"})
    base = f"http://127.0.0.1:{port}"
    st.wait_status(f"{base}/health", proc)
    status, body = st.http(
        f"{base}/v1/chat/completions",
        {
            "model": "kimi-k2",
            "messages": [{"role": "user", "content": "hello"}],
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
        },
    )
    assert status == 200
    reply = json.loads(body)
    assert reply["choices"] == []
    assert "tool_calls" not in json.dumps(reply)


def test_die_after_exits_1_after_becoming_ready(env: st.Env, procs: list[st.Proc]) -> None:
    port = st.free_port()
    proc = st.start(procs, env, st.sglang_argv(env, port), {"K2_LAB_FAULT": "die_after=1"})
    st.wait_status(f"http://127.0.0.1:{port}/health", proc)
    assert proc.wait_exit(timeout=15) == 1
    assert "fault injected (K2_LAB_FAULT=die_after=1): exiting 1" in proc.output()
