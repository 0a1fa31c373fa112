"""The pure parts of launch-failure handling: the weights-in-place check on real files, and the
health-gate probe's command, answer and failure wording."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import pytest

from k2provision.core.records import HealthGate, Process
from k2provision.ops import launch_gate as lg
from k2provision.plan.containers import LABEL_HASH
from k2provision.plan.host_questions import hq
from k2provision.run.events import HostResult, Tally
from k2provision.weights.kernel import checkpoint

# ---------------------------------------------------------------- weights in place


def shard(path: Path, data: int = 16, *, extra: int = 0, header_cut: int = 0) -> None:
    header = json.dumps({"w": {"dtype": "U8", "shape": [data], "data_offsets": [0, data]}}).encode()
    blob = struct.pack("<Q", len(header)) + header + b"\0" * (data + extra)
    path.write_bytes(blob[: len(blob) - header_cut] if header_cut else blob)


def model_dir(tmp_path: Path, shards: int = 3) -> Path:
    directory = tmp_path / "Kimi-K2-Instruct"
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps({"model_type": "kimi_k2"}))
    names = [f"model-{i:05d}-of-{shards:05d}.safetensors" for i in range(1, shards + 1)]
    weight_map = {f"layer.{i}.w": name for i, name in enumerate(names)}
    (directory / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    for name in names:
        shard(directory / name)
    return directory


def test_a_complete_checkpoint_passes(tmp_path: Path) -> None:
    assert checkpoint.checkpoint_problems(str(model_dir(tmp_path))) == []


def test_the_lab_fixture_passes(tmp_path: Path) -> None:
    """The lab writes only `{}` as config.json, with no index: nothing to check beyond it."""
    (tmp_path / "config.json").write_text("{}\n")
    assert checkpoint.checkpoint_problems(str(tmp_path)) == []


def test_an_absent_directory_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    assert checkpoint.checkpoint_problems(str(missing)) == [f"{missing} does not exist"]


def test_config_missing_or_unparseable(tmp_path: Path) -> None:
    directory = model_dir(tmp_path)
    (directory / "config.json").unlink()
    assert checkpoint.checkpoint_problems(str(directory)) == ["config.json is missing"]
    (directory / "config.json").write_text("{not json")
    [problem] = checkpoint.checkpoint_problems(str(directory))
    assert problem.startswith("config.json is not valid JSON")


def test_an_index_that_is_no_regular_file_or_too_large_is_refused_unread(tmp_path: Path) -> None:
    """A FIFO would block the read and a huge file exhaust memory: neither is read."""
    directory = model_dir(tmp_path)
    index = directory / "model.safetensors.index.json"
    index.unlink()
    os.mkfifo(index)
    assert checkpoint.checkpoint_problems(str(directory)) == [
        "model.safetensors.index.json is not a regular file"
    ]
    index.unlink()
    with index.open("wb") as f:  # sparse: no disk spent
        f.truncate(checkpoint.JSON_LIMIT + 1)
    [problem] = checkpoint.checkpoint_problems(str(directory))
    assert problem.startswith("model.safetensors.index.json holds 67108865 bytes, more than")


def test_a_missing_shard_is_named(tmp_path: Path) -> None:
    directory = model_dir(tmp_path)
    (directory / "model-00002-of-00003.safetensors").unlink()
    assert checkpoint.checkpoint_problems(str(directory)) == [
        "1 of 3 shards named by model.safetensors.index.json are missing: "
        "model-00002-of-00003.safetensors"
    ]


def test_a_shard_of_the_wrong_size_is_named(tmp_path: Path) -> None:
    directory = model_dir(tmp_path)
    shard(directory / "model-00003-of-00003.safetensors", extra=5)
    [problem] = checkpoint.checkpoint_problems(str(directory))
    assert problem.startswith("model-00003-of-00003.safetensors: ")
    assert "!= file size" in problem


def test_a_truncated_header_is_named(tmp_path: Path) -> None:
    directory = model_dir(tmp_path)
    path = directory / "model-00001-of-00003.safetensors"
    path.write_bytes(path.read_bytes()[:20])
    [problem] = checkpoint.checkpoint_problems(str(directory))
    assert problem.startswith("model-00001-of-00003.safetensors: header length")


def test_an_index_without_a_weight_map(tmp_path: Path) -> None:
    directory = model_dir(tmp_path)
    (directory / "model.safetensors.index.json").write_text("{}")
    assert checkpoint.checkpoint_problems(str(directory)) == [
        "model.safetensors.index.json has no weight_map of tensor -> shard file"
    ]


# ---------------------------------------------------------------- the gate probe

URL_GATE = HealthGate(url="http://10.0.0.1:30000/health", timeout_s=600)


def proc(name: str = "sglang-decode", **kw: object) -> Process:
    fields: dict[str, object] = {
        "name": name,
        "container": "k2-sglang",
        "image": "img",
        "argv": ("x",),
        **kw,
    }
    return Process.model_validate(fields)


def test_probe_asks_for_each_process_and_gate() -> None:
    asked = lg.probe(
        [
            proc(health=URL_GATE),
            proc("ray-head", exec_in=True, health=HealthGate(command=("ray", "status"))),
        ],
        "/etc/k2provision",
    )
    questions = {t.key: t.question for t in asked.batch.tickets}
    assert questions == {
        "state 0": hq.ContainerQuestion("k2-sglang", LABEL_HASH),
        "gate 0": hq.HttpQuestion(URL_GATE.url or "", "/etc/k2provision/tls/ca.pem"),
        "state 1": hq.ExecQuestion("k2-sglang", "/run/k2-ray-head.pid"),
        "gate 1": hq.CommandQuestion("k2-sglang", ("ray", "status")),
    }


def test_probe_answer_is_read_per_process_and_gate() -> None:
    asked = lg.probe(
        [
            proc(health=URL_GATE),
            proc("ray-head", exec_in=True, health=HealthGate(command=("ray", "status"))),
            proc("other"),
        ],
        "/etc/k2provision",
    )
    exited = json.dumps([{"State": {"Status": "exited", "Running": False, "ExitCode": 1}}])
    created = json.dumps([{"State": {"Status": "created", "Running": False, "ExitCode": 0}}])
    output = "".join(
        [
            hq.render_answer("state 0", hq.Answer((exited,), (), 0)),
            hq.render_answer("gate 0", hq.Answer(("no answer timed out",), (), 0)),
            hq.render_answer("state 1", hq.Answer(("running 1769860740",), (), 0)),
            hq.render_answer("gate 1", hq.Answer((), (), 0)),
            hq.render_answer("state 2", hq.Answer((created,), (), 0)),
            hq.END,
        ]
    )
    states, gates = lg.read_probe(asked, output)
    assert states[0].dead
    assert states[0].reason() == "exited with code 1 before passing its health gate"
    assert states[1] == lg.ProcState("running")
    assert states[2].state == "starting"
    assert {i: g.text for i, g in gates.items()} == {0: "no answer (timed out)", 1: "0"}
    assert lg.ProcState("missing").reason() == "its container is gone"
    gone, _ = lg.read_probe(asked, hq.END)
    assert gone[0] == lg.ProcState("missing")
    assert gone[1] == lg.ProcState("exited")


def test_a_gate_passes_only_on_its_expected_answer() -> None:
    assert lg.gate_passed(URL_GATE, hq.GateAnswer(200))
    assert not lg.gate_passed(URL_GATE, hq.GateAnswer(503))
    assert not lg.gate_passed(URL_GATE, hq.GateAnswer(None, "refused"))
    assert not lg.gate_passed(URL_GATE, None)
    command_gate = HealthGate(command=("true",))
    assert lg.gate_passed(command_gate, hq.GateAnswer(0))
    assert not lg.gate_passed(command_gate, hq.GateAnswer(1))


@pytest.mark.parametrize(("cap", "expected"), [(0, 600), (30, 30), (9999, 600)])
def test_the_timeout_cap_only_shortens(cap: int, expected: int) -> None:
    assert lg.gate_timeout(URL_GATE, cap) == expected


def test_a_failure_names_host_process_reason_gate_and_log() -> None:
    log = [f"line {i}" for i in range(80)]
    gate = lg.gate_text(URL_GATE, 30)
    failure = lg.failure("d1", proc(health=URL_GATE), "exited with code 1", gate, log)
    assert failure["summary"] == "d1: sglang-decode: exited with code 1"
    assert gate == "GET http://10.0.0.1:30000/health answering 200, timeout 30 s"
    details = failure["details"].splitlines()
    assert details[0] == f"gate: {gate}"
    assert details[1] == "last 50 log lines (docker logs k2-sglang):"
    assert details[2:] == [f"  | line {i}" for i in range(30, 80)]


def test_logs_of_an_execd_process_come_from_its_file() -> None:
    _, execd = lg.logs_probe(proc("ray-head", exec_in=True))
    assert execd.question.command() == (
        "docker exec k2-sglang tail -n 50 /run/k2-ray-head.log 2>&1"
    )
    _, container = lg.logs_probe(proc())
    assert container.question.command() == "docker logs --tail 50 k2-sglang 2>&1"


def test_the_summary_keeps_the_first_line_of_a_failure() -> None:
    """A launch failure's message goes on with its gate and log lines; the run summary's
    "first failure" column holds its first line: host, process and reason."""
    tally = Tally()
    tally.add(
        HostResult(
            "d1",
            "Stage | Launch failed (stage 0)",
            "failed",
            "d1: sglang-decode: exited with code 1\ngate: GET http://x\n  | log",
        )
    )
    assert tally.failures == {
        "d1": "Stage | Launch failed (stage 0): d1: sglang-decode: exited with code 1"
    }
