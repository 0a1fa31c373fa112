"""`render --out`: where it may write, and the one line it says when it may not."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from tests.k2provision.unit.contract_support import HostTrap

PD = (
    "[prefill]\np1 ansible_host=10.0.0.1\np2 ansible_host=10.0.0.2\n"
    "[decode]\nd1 ansible_host=10.0.0.11\nd2 ansible_host=10.0.0.12\n"
    "[all:vars]\nk2_engine=sglang\nk2_layout=pd\n"
)
VLLM = (
    "[nodes]\nn1 ansible_host=10.0.0.1\nn2 ansible_host=10.0.0.2\n"
    "[all:vars]\nk2_engine=vllm\nk2_layout=tp\n"
)


def inventory(tmp_path: Path, text: str = PD) -> Path:
    path = tmp_path / "inv.ini"
    path.write_text(text)
    return path


def refused(host_trap: HostTrap, *args: str) -> str:
    code, out, err, unexpected = host_trap.run("render", *args)
    assert unexpected is None, unexpected
    assert code == 2, (out, err)
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("error: "), err
    return lines[0]


def test_out_is_a_file(tmp_path: Path, host_trap: HostTrap) -> None:
    (tmp_path / "taken").write_text("x")
    line = refused(host_trap, str(inventory(tmp_path)), "--out", str(tmp_path / "taken"))
    assert "is a file" in line


def test_out_under_a_file(tmp_path: Path, host_trap: HostTrap) -> None:
    (tmp_path / "taken").write_text("x")
    out = tmp_path / "taken" / "deeper" / "out"
    line = refused(host_trap, str(inventory(tmp_path)), "--out", str(out))
    assert f"lies under {tmp_path / 'taken'}" in line


def test_out_where_nothing_can_be_written(tmp_path: Path, host_trap: HostTrap) -> None:
    line = refused(host_trap, str(inventory(tmp_path)), "--out", "/sys/k2provision-render-test")
    assert "cannot write" in line


def test_host_names_never_leave_out(tmp_path: Path, host_trap: HostTrap) -> None:
    text = PD.replace("p2 ansible_host=10.0.0.2", "../../escape ansible_host=10.0.0.2")
    out = tmp_path / "a" / "b" / "out"
    line = refused(host_trap, str(inventory(tmp_path, text)), "--out", str(out))
    assert "'../../escape'" in line
    assert not (tmp_path / "a" / "escape").exists()
    assert not out.exists()


def test_foreign_directory_needs_force(tmp_path: Path, host_trap: HostTrap) -> None:
    out = tmp_path / "home"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    line = refused(host_trap, str(inventory(tmp_path)), "--out", str(out))
    assert "--force" in line
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]
    inv = str(inventory(tmp_path))
    code, _, err, _ = host_trap.run("render", inv, "--out", str(out), "--force")
    assert code == 0, err
    assert (out / "notes.txt").read_text() == "mine"
    assert (out / "plan.json").exists()


def test_rerender_replaces_its_own_previous_render(tmp_path: Path, host_trap: HostTrap) -> None:
    out = tmp_path / "out"
    more = "n3 ansible_host=10.0.0.3\nn4 ansible_host=10.0.0.4\n[all:vars]"
    # Four nodes in pipeline stages (TP 32 would cut the FP8 experts' 128-wide blocks).
    four = VLLM.replace("[all:vars]", more).replace("k2_layout=tp", "k2_layout=tp_pp")
    code, _, err, _ = host_trap.run("render", str(inventory(tmp_path, four)), "--out", str(out))
    assert code == 0, err
    assert (out / "n4").is_dir()
    two = str(inventory(tmp_path, VLLM))
    code, stdout, err, _ = host_trap.run("render", two, "--out", str(out))
    assert code == 0, err
    assert not (out / "n4").exists()  # the host left the inventory, its files left the render
    plan = json.loads((out / "plan.json").read_text())
    for host in plan["hosts"]:
        for path, content in host["files"].items():
            assert (out / host["name"] / path.lstrip("/")).read_text() == content
    assert "wrote" in stdout


# Host names for addresses: the socket interface cannot be derived, and the plan warns.
NAMED = VLLM.replace("ansible_host=10.0.0.1", "ansible_host=n1.cluster").replace(
    "ansible_host=10.0.0.2", "ansible_host=n2.cluster"
)


@pytest.mark.parametrize("text", [NAMED])
def test_render_prints_the_plan_warnings(tmp_path: Path, host_trap: HostTrap, text: str) -> None:
    code, _, err, _ = host_trap.run(
        "render", str(inventory(tmp_path, text)), "--out", str(tmp_path / "out")
    )
    assert code == 0
    assert "warning: k2_socket_ifname is unset" in err


def test_empty_out_is_refused(tmp_path: Path, host_trap: HostTrap) -> None:
    code, _, err, _ = host_trap.run("render", str(inventory(tmp_path)), "--out", "")
    line, usage, _ = err.splitlines()  # a bad argument: the error, then the usage
    assert code == 2
    assert "--out '' names no directory" in line
    assert "fix:" in line
    assert usage.startswith("Usage: ")


def test_out_that_is_a_link_is_refused(tmp_path: Path, host_trap: HostTrap) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    line = refused(host_trap, str(inventory(tmp_path)), "--out", str(tmp_path / "link"))
    assert f"--out {tmp_path / 'link'} is a symbolic link" in line
    assert not any((tmp_path / "real").iterdir())


def test_links_in_an_earlier_render_are_replaced_not_followed(
    tmp_path: Path, host_trap: HostTrap
) -> None:
    inv, out, outside = inventory(tmp_path), tmp_path / "out", tmp_path / "outside"
    outside.mkdir()
    code, _, err, _ = host_trap.run("render", str(inv), "--out", str(out))
    assert code == 0, err
    host_dir = out / "p1"
    for path in list(host_dir.iterdir()):
        path.unlink() if path.is_file() else shutil.rmtree(path)
    host_dir.rmdir()
    host_dir.symlink_to(outside)  # a host directory replaced by a link out of --out
    (out / "plan.json").unlink()
    (out / "plan.json").symlink_to(outside / "plan.json")
    code, _, err, _ = host_trap.run("render", str(inv), "--out", str(out))
    assert code == 0, err
    assert not any(outside.iterdir())
    assert not host_dir.is_symlink()
    assert host_dir.is_dir()
    assert not (out / "plan.json").is_symlink()
    assert (out / "plan.json").is_file()


def _rendered_files(out: Path) -> dict[str, Path]:
    """One file of each kind a render writes: plan, manifest, a host's file, monitoring's."""
    host_file = next(p for p in sorted((out / "p1").rglob("*")) if p.is_file())
    monitoring = next(p for p in sorted((out / "monitoring").rglob("*")) if p.is_file())
    return {
        "plan": out / "plan.json",
        "manifest": out / ".k2provision-render.json",
        "host file": host_file,
        "monitoring file": monitoring,
    }


@pytest.mark.parametrize("kind", ["plan", "manifest", "host file", "monitoring file"])
@pytest.mark.parametrize("link", ["hard", "symbolic"])
def test_files_left_as_links_are_replaced_never_written_through(
    tmp_path: Path, host_trap: HostTrap, kind: str, link: str
) -> None:
    inv, out, outside = inventory(tmp_path), tmp_path / "out", tmp_path / "outside.txt"
    code, _, err, _ = host_trap.run("render", str(inv), "--out", str(out))
    assert code == 0, err
    target = _rendered_files(out)[kind]
    rendered = target.read_text()
    # The manifest must still read as one (the same list, written another way) to be trusted.
    own = json.dumps(json.loads(rendered)) if kind == "manifest" else "operator's own file"
    outside.write_text(own + "\n")
    target.unlink()
    if link == "hard":
        os.link(outside, target)
    else:
        target.symlink_to(outside)
    code, _, err, _ = host_trap.run("render", str(inv), "--out", str(out))
    assert outside.read_text() == own + "\n"
    if kind == "manifest" and link == "symbolic":
        assert code == 2  # a manifest that is a link is not trusted: no earlier render
        assert "holds no earlier render" in err
        return
    assert code == 0, err
    assert not target.is_symlink()
    assert target.stat().st_nlink == 1
    assert target.read_text() == rendered
    assert not list(out.rglob(".k2provision-new-*"))


def test_a_manifest_that_is_a_fifo_is_not_read(tmp_path: Path, host_trap: HostTrap) -> None:
    inv, out = inventory(tmp_path), tmp_path / "out"
    out.mkdir()
    os.mkfifo(out / ".k2provision-render.json")
    line = refused(host_trap, str(inv), "--out", str(out))
    assert "holds no earlier render" in line
