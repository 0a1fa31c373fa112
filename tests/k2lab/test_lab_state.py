"""The lab's state file, process identity, configuration and root check (no root needed)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from k2lab import core
from k2lab.cli import lab_app
from k2lab.config import LabConfig
from k2lab.errors import LabError, NotRootError
from k2lab.net import tbf_args
from k2lab.proc import ProcRef, is_alive, proc_ref
from k2lab.state import HostState, LabState, load_state, save_state


def host(index: int) -> HostState:
    return HostState(
        name=f"lab{index}",
        index=index,
        address=f"10.77.0.{10 + index}",
        netns=f"k2lab-lab{index}",
        veth=f"k2labv{index}",
        dir=f"/lab/instances/k2lab/hosts/lab{index}",
    )


def state() -> LabState:
    return LabState(
        name="k2lab",
        lab_dir="/lab",
        subnet="10.77.0.0/24",
        bridge="k2lab0",
        controller_ip="10.77.0.1",
        ssh_port=22,
        private_key="/lab/ssh/id_ed25519",
        known_hosts="/lab/instances/k2lab/known_hosts",
    )


def test_state_round_trips_through_its_file(tmp_path: Path) -> None:
    me = proc_ref(os.getpid())
    assert me is not None
    recorded = state().with_host(host(2).model_copy(update={"init": me, "mounts": ("/a", "/b")}))
    recorded = recorded.with_host(host(1))
    path = tmp_path / "state.json"
    save_state(path, recorded)
    assert load_state(path) == recorded
    assert recorded.host_names == ("lab1", "lab2")  # kept in index order
    assert recorded.addresses == {"lab1": "10.77.0.11", "lab2": "10.77.0.12"}
    assert not list(tmp_path.glob("*.tmp"))


def test_missing_state_is_none_and_a_corrupt_one_is_an_error(tmp_path: Path) -> None:
    assert load_state(tmp_path / "absent.json") is None
    bad = tmp_path / "state.json"
    bad.write_text(json.dumps({**state().model_dump(mode="json"), "surprise": 1}))
    with pytest.raises(LabError, match="unreadable lab state"):
        load_state(bad)


def test_hosts_are_replaced_and_removed_by_name() -> None:
    s = state().with_host(host(1)).with_host(host(2))
    s = s.with_host(host(1).model_copy(update={"host_key": "ssh-ed25519 X"}))
    assert [h.host_key for h in s.hosts] == ["ssh-ed25519 X", ""]
    assert s.without_host("lab1").host_names == ("lab2",)
    with pytest.raises(LabError, match="no lab host named 'lab7'; lab hosts: lab1, lab2"):
        s.host("lab7")


def test_a_process_is_known_by_pid_and_start_time() -> None:
    me = proc_ref(os.getpid())
    assert me is not None
    assert is_alive(me)
    assert not is_alive(ProcRef(pid=me.pid, start_time=me.start_time + 1))  # a reused PID
    assert not is_alive(None)
    assert proc_ref(2**22 + 1) is None


def test_config_names_and_addresses(tmp_path: Path) -> None:
    cfg = LabConfig(lab_dir=tmp_path)
    assert (cfg.bridge, cfg.controller_ip) == ("k2lab0", "10.77.0.1")
    assert (cfg.host_name(3), cfg.host_ip(3), cfg.netns(3), cfg.veth(3)) == (
        "lab3",
        "10.77.0.13",
        "k2lab-lab3",
        "k2labv3",
    )
    other = LabConfig(lab_dir=tmp_path, name="k2labt", subnet="10.78.0.0/24")
    assert other.host_ip(1) == "10.78.0.11"
    assert len(other.veth(200)) <= 15


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"name": "Bad"}, "lab name"),
        ({"name": "muchtoolong"}, "lab name"),
        ({"subnet": "10.77.0.0/16"}, "IPv4 /24"),
        ({"ssh_port": 2233}, "2233 belongs to the sshd inside engine containers"),
    ],
)
def test_config_refuses_bad_values(tmp_path: Path, kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(LabError, match=message):
        LabConfig(lab_dir=tmp_path, **kwargs)  # type: ignore[arg-type]


def test_lab_dir_with_unsafe_characters_is_refused(tmp_path: Path) -> None:
    with pytest.raises(LabError, match="overlayfs"):
        LabConfig(lab_dir=tmp_path / "a,b")


def test_token_bucket_arguments() -> None:
    assert tbf_args(100) == ["tbf", "rate", "100mbit", "burst", "125000", "latency", "100ms"]
    assert tbf_args(1)[4] == str(32 * 1024)
    with pytest.raises(LabError, match="positive"):
        tbf_args(0)


def test_not_root_is_one_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    cfg = LabConfig(lab_dir=tmp_path)
    for call in (lambda: core.up(4, cfg=cfg), lambda: core.down(cfg=cfg)):
        with pytest.raises(NotRootError, match="needs root"):
            call()
    assert not list(tmp_path.iterdir())  # nothing was touched


def test_cli_exits_2_with_one_line_when_not_root(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setenv("K2_LAB_DIR", str(tmp_path))
    result = CliRunner().invoke(lab_app, ["up", "4"])
    assert result.exit_code == 2
    assert "needs root" in result.output
    assert "Traceback" not in result.output


def test_status_of_a_lab_that_is_not_up(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("K2_LAB_DIR", str(tmp_path))
    st = core.status(LabConfig(lab_dir=tmp_path, name="k2labu", subnet="10.79.0.0/24"))
    assert not st.up
    assert not st.healthy
    assert st.hosts == ()


def test_up_with_bench_client_sets_the_client_image_and_builds_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`lab up --bench-client` wiring only (the image itself is built and used by the bastion
    lab test): the inventory's k2_image names the client image, which is built instead of the
    plain stand-in."""
    import k2lab.cli as lab_cli
    from k2lab.standin import CLIENT_IMAGE

    monkeypatch.setenv("K2_LAB_DIR", str(tmp_path))
    seen: dict[str, object] = {}
    monkeypatch.setattr(lab_cli.core, "up", lambda n, **kw: seen.update(kw) or state())
    monkeypatch.setattr(lab_cli, "build_standin_client", lambda **kw: seen.update(client=1))
    monkeypatch.setattr(lab_cli, "build_standin", lambda **kw: seen.update(plain=1))
    monkeypatch.setattr(lab_cli, "_print_hosts", lambda st: None)
    result = CliRunner().invoke(
        lab_app, ["up", "2", "--bench-client", "--var", "k2_engine=sglang", "--group", "sglang=2"]
    )
    assert result.exit_code == 0, result.output
    assert seen["all_vars"] == {"k2_engine": "sglang", "k2_image": CLIENT_IMAGE}
    assert seen.get("client") == 1
    assert "plain" not in seen
