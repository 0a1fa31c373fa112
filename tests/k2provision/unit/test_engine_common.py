"""What every engine shares: host values found by the launch script, socket interfaces, parsers.

The launch scripts run here for real (`sh`, this machine's own interfaces): a value the plan
cannot know is found on the host when the process starts, and a host that cannot provide it
stops the launch with the reason and the fix.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from k2provision.core import catalog
from k2provision.core.records import Cluster, HostSpec, LaunchValue, Process, Tunables
from k2provision.core.templating import (
    host_values_path,
    host_values_script,
    launch_script,
    shell_word,
    with_host_values,
)
from k2provision.engines.common import IFNAME, socket_env, socket_ifname, tool_parser


def run_launch(tmp_path: Path, process: Process) -> subprocess.CompletedProcess[str]:
    """Write the host-values program and the launch script under `tmp_path`, run it."""
    config_dir = str(tmp_path)
    program = Path(host_values_path(config_dir))
    program.parent.mkdir(parents=True, exist_ok=True)
    program.write_text(host_values_script())
    script = tmp_path / "launch.sh"
    script.write_text(launch_script(process, config_dir))
    return subprocess.run(
        ["sh", str(script)], capture_output=True, text=True, timeout=60, check=False
    )


def echo_process(
    resolve: tuple[LaunchValue, ...], env: dict[str, str], argv: tuple[str, ...]
) -> Process:
    """A process that prints its environment and arguments as JSON."""
    printer = "import json, os, sys; print(json.dumps([dict(os.environ), sys.argv[1:]]))"
    return Process(
        name="echo",
        container="c",
        image="i",
        env=env,
        resolve=resolve,
        argv=(sys.executable, "-c", printer, *argv),
    )


def test_launch_script_finds_the_interface_of_the_local_ip(tmp_path: Path) -> None:
    ifname = IFNAME.model_copy(update={"arg": "127.0.0.1"})
    proc = echo_process(
        (ifname,),
        {"NCCL_SOCKET_IFNAME": ifname.ref, "PLAIN": "a b'c"},
        ("-mca", "btl_tcp_if_include", ifname.ref, "x ${K2_SOCKET_IFNAME} y"),
    )
    out = run_launch(tmp_path, proc)
    assert out.returncode == 0, out.stderr
    env, argv = json.loads(out.stdout)
    assert env["NCCL_SOCKET_IFNAME"] == "lo"
    assert env["PLAIN"] == "a b'c"
    assert argv == ["-mca", "btl_tcp_if_include", "lo", "x lo y"]
    assert "k2provision: K2_SOCKET_IFNAME=lo" in out.stderr


def test_launch_stops_when_no_interface_holds_the_local_ip(tmp_path: Path) -> None:
    ifname = IFNAME.model_copy(update={"arg": "192.0.2.254"})  # TEST-NET-1, nobody's
    out = run_launch(tmp_path, echo_process((ifname,), {"NCCL_SOCKET_IFNAME": ifname.ref}, ()))
    assert out.returncode == 1
    assert out.stdout == ""  # the engine never started
    assert "no network interface of this host holds 192.0.2.254 (k2_local_ip)" in out.stderr
    assert "fix: set k2_local_ip" in out.stderr


@pytest.mark.parametrize(
    ("kind", "arg", "check"),
    [
        ("cidr-of", "127.0.0.1", lambda v: v == "127.0.0.0/8"),
        ("physical-cores-minus", "0", lambda v: int(v) >= 1),
        ("physical-cores-minus", "100000", lambda v: v == "1"),
        ("numa-nodes", "", lambda v: int(v) >= 1),
    ],
)
def test_host_value_kinds(tmp_path: Path, kind: str, arg: str, check: object) -> None:
    value = LaunchValue(name="V", kind=kind, arg=arg)  # type: ignore[arg-type]
    out = run_launch(tmp_path, echo_process((value,), {"V": value.ref}, ()))
    assert out.returncode == 0, out.stderr
    env, _ = json.loads(out.stdout)
    assert callable(check)
    assert check(env["V"]), env["V"]


def test_shell_words_keep_only_declared_references() -> None:
    assert shell_word("${A}", ["A"]) == '"${A}"'
    assert shell_word("${A}", []) == "'${A}'"  # undeclared: literal text
    assert shell_word("a ${A}-$B", ["A"]) == "'a '\"${A}\"'-$B'"


def test_with_host_values_gives_the_argv_the_engine_sees() -> None:
    ifname = IFNAME.model_copy(update={"arg": "10.0.0.1"})
    proc = echo_process((ifname,), {"NCCL_SOCKET_IFNAME": ifname.ref}, (ifname.ref,))
    filled = with_host_values(proc, {"K2_SOCKET_IFNAME": "bond0"})
    assert filled.env["NCCL_SOCKET_IFNAME"] == "bond0"
    assert filled.argv[-1] == "bond0"
    assert filled.resolve == ()


def cluster(local_ips: tuple[str, ...], **tunables: object) -> Cluster:
    hosts = tuple(
        HostSpec(name=f"h{i}", address=f"10.0.0.{i + 1}", pool="nodes", local_ip=ip)
        for i, ip in enumerate(local_ips)
    )
    return Cluster(
        inventory="t.ini",
        engine="sglang",
        layout="tp",
        model="moonshotai/Kimi-K2-Instruct",
        model_dir="/m",
        gpu="h200",
        gpus_per_node=8,
        hosts=hosts,
        tunables=Tunables.model_validate(tunables),
    )


def test_socket_interface_rules() -> None:
    two = cluster(("10.1.0.1", "h1.cluster"))
    name, values = socket_ifname(two, two.hosts[0])
    assert name == "${K2_SOCKET_IFNAME}"
    assert values[0].arg == "10.1.0.1"
    assert socket_ifname(two, two.hosts[1]) == (None, ())  # a name: nothing to derive
    named = cluster(("10.1.0.1", "10.1.0.2"), socket_ifname="ib0")
    assert socket_ifname(named, named.hosts[1]) == ("ib0", ())
    one = cluster(("10.1.0.1",))
    assert socket_ifname(one, one.hosts[0]) == (None, ())
    assert socket_env(None) == {}
    assert set(socket_env("x", nvshmem=True)) == {
        "NCCL_SOCKET_IFNAME",
        "GLOO_SOCKET_IFNAME",
        "NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME",
    }


def test_parsers_come_from_the_model_spec() -> None:
    spec = catalog.model("moonshotai/Kimi-K2-Instruct")
    assert tool_parser(spec) == "kimi_k2"
    assert spec.reasoning_parser is None  # today's models do not think aloud


GOLDEN = Path(__file__).resolve().parents[2] / "golden"


@pytest.mark.parametrize(
    ("case", "program", "flag"),
    [
        ("sglang-pd-1p1d", "sglang.launch_server", "--reasoning-parser"),
        ("vllm-dp16-ep", "vllm", "--reasoning-parser"),
        ("trtllm-tp16-ep8", "trtllm-serve", "--reasoning_parser"),
        ("ktransformers", "sglang.launch_server", "--reasoning-parser"),
    ],
)
def test_a_thinking_model_gets_its_reasoning_parser(case: str, program: str, flag: str) -> None:
    from k2provision.plan.assemble import build_plan
    from k2provision.plan.inventory import load_cluster

    cl = load_cluster(GOLDEN / case / "inventory.ini")
    spec = catalog.model(cl.model)
    before = build_plan(cl, spec)
    thinking = build_plan(cl, spec.model_copy(update={"reasoning_parser": "kimi_k2"}))
    servers = [p for h in thinking.hosts for p in h.processes if program in p.argv]
    assert servers
    for proc in servers:
        argv = list(proc.argv)
        assert argv[argv.index(flag) + 1] == "kimi_k2"
    assert not any(flag in p.argv for h in before.hosts for p in h.processes)


@pytest.mark.parametrize("case", sorted(p.name for p in GOLDEN.iterdir() if p.is_dir()))
def test_every_container_option_comes_with_its_reason(case: str) -> None:
    from k2provision.plan.assemble import build_plan
    from k2provision.plan.inventory import load_cluster

    options = build_plan(load_cluster(GOLDEN / case / "inventory.ini")).container
    rendered = [f"--network {options.network}", f"--ipc {options.ipc}"]
    rendered += [f"--gpus {options.gpus}"] if options.gpus else []
    rendered += [f"--cap-add {c}" for c in options.cap_add]
    rendered += [f"--ulimit {u}" for u in options.ulimits]
    rendered += [f"--device {d}" for d in options.devices]
    rendered += [f"--volume {v}" for v in options.volumes]
    cache = options.compile_cache
    rendered += [f"--volume {cache}:{cache}"] if cache else []
    assert sorted(rendered) == sorted(options.reasons)
    assert options.privileged is False
    multi_host = len({h.name for h in load_cluster(GOLDEN / case / "inventory.ini").hosts}) > 1
    assert ("/dev/infiniband" in options.devices) is multi_host
    assert ("IPC_LOCK" in options.cap_add) is multi_host
