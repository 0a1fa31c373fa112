"""The contract's values: ranges on every number, role variables from the roles' own specs,
IPv6 wiring, and messages that stay one line on big clusters."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from k2provision.core import role_specs
from k2provision.core.records import NUMERIC_ANNOTATIONS, Cluster, Tunables
from k2provision.core.variables import bounds, value_range
from k2provision.engines.common import host_port, http_url
from k2provision.errors import InventoryError
from k2provision.plan.assemble import build_plan
from k2provision.plan.inventory import load_cluster
from tests.k2provision.unit.contract_support import HostTrap

ROOT = Path(__file__).resolve().parents[3]


def write(tmp_path: Path, text: str, name: str = "inv.ini") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.parametrize("model", [Tunables, Cluster])
def test_every_numeric_field_has_a_range(model: type[Tunables] | type[Cluster]) -> None:
    """A numeric knob added later without bounds fails here."""
    numeric = {n: f for n, f in model.model_fields.items() if f.annotation in NUMERIC_ANNOTATIONS}
    assert numeric, model
    for name, field in numeric.items():
        low, high = bounds(field)
        assert low is not None, f"{model.__name__}.{name} has no lower bound"
        assert high is not None, f"{model.__name__}.{name} has no upper bound"
        if not field.is_required() and field.default is not None:
            assert low <= field.default <= high, name
        assert "from" in value_range(f"k2_{name}"), name


def test_value_ranges_read_as_words() -> None:
    assert value_range("k2_api_port") == "an integer from 1 to 65535"
    assert value_range("k2_reserve_gib") == "a number from 0 to 256"
    assert value_range("k2_decode_redundant_experts") == "an integer from 0 to 1024, or unset"
    assert value_range("k2_pd_transfer_backend") == "one of mooncake, nixl"
    assert value_range("k2_lab") == "true or false"
    assert value_range("k2_context_length").startswith("an integer from 1 to")


def nodes_inventory(extra: str) -> str:
    return (
        "[nodes]\na ansible_host=10.0.0.1\nb ansible_host=10.0.0.2\n"
        f"[all:vars]\nk2_engine=vllm\nk2_layout=tp\n{extra}"
    )


@pytest.mark.parametrize(
    ("text", "check"),
    [
        ("k2_lab=yes\n", lambda c: c.lab is True),
        ("k2_lab=False\n", lambda c: c.lab is False),
        ("k2_context_length=8192\n", lambda c: c.context_length == 8192),
        ("k2_api_port='8080'\n", lambda c: c.tunables.api_port == 8080),
        ("k2_reserve_gib=0\n", lambda c: c.tunables.reserve_gib == 0),
        ("k2_served_model_name=42\n", lambda c: c.tunables.served_model_name == "42"),
        ("k2_nvidia_driver_manage=false\nk2_launch_gate_delay=2\n", lambda c: True),
        ("k2_nccl_check_args={{ k2_extra_nccl_args | default([]) }}\n", lambda c: True),
        (
            "k2_model=moonshotai/Kimi-K2-Instruct\n"
            "k2_model_dir=/models/{{ k2_model | basename }}\n",
            lambda c: c.model_dir == "/models/Kimi-K2-Instruct",
        ),
    ],
)
def test_good_values_are_read(tmp_path: Path, text: str, check: Any) -> None:
    assert check(load_cluster(write(tmp_path, nodes_inventory(text))))


def test_role_variables_are_judged_by_the_spec() -> None:
    assert role_specs.role_of("k2_nccl_check_enabled") == "k2_nccl_check"
    assert role_specs.value_problem("k2_nccl_check_enabled", "true") is None
    assert role_specs.value_problem("k2_nccl_check_enabled", "sometimes") == "true or false"
    assert role_specs.value_problem("k2_nccl_check_args", ["-b", "1G"]) is None
    assert role_specs.value_problem("k2_launch_gate_delay", "{{ x }}") is None


def test_a_long_host_list_is_shortened(tmp_path: Path) -> None:
    inv = write(
        tmp_path,
        "[nodes]\ngpu-[001:512]\n[all:vars]\nk2_engine=vllm\nk2_layout=tp_pp\nk2_colour=red\n",
    )
    with pytest.raises(InventoryError) as info:
        load_cluster(inv)
    (line,) = info.value.problems
    assert line.startswith("gpu-001 … gpu-512, 512 hosts: unknown variable k2_colour")


def test_the_host_that_differs_is_named_once(tmp_path: Path) -> None:
    hosts = "".join(f"g{i} ansible_host=10.0.0.{i}\n" for i in range(1, 17))
    inv = write(
        tmp_path,
        "[nodes]\n"
        + hosts.replace("g1 ansible_host=10.0.0.1", "g1 ansible_host=10.0.0.1 k2_gpus_per_node=4")
        + "[all:vars]\nk2_engine=vllm\nk2_layout=tp_pp\nk2_gpus_per_node=8\n",
    )
    with pytest.raises(InventoryError) as info:
        load_cluster(inv)
    (line,) = info.value.problems
    assert line.startswith(
        "g1: k2_gpus_per_node=4 differs from the other 15 hosts' k2_gpus_per_node=8"
    )


def test_host_port_brackets_ipv6_only() -> None:
    assert host_port("10.0.0.1", 80) == "10.0.0.1:80"
    assert host_port("gpu-1", 80) == "gpu-1:80"
    assert host_port("fd00::1", 5757) == "[fd00::1]:5757"
    assert http_url("fd00::1", 8000, "/health") == "http://[fd00::1]:8000/health"


def all_strings(plan: Any) -> list[str]:
    found: list[str] = []
    for host in plan.hosts:
        for proc in host.processes:
            found += [*proc.argv, *proc.env.values()]
            found.append((proc.health.url or "") if proc.health else "")
        found += list(host.files.values())
    return [*found, plan.endpoint]


@pytest.mark.parametrize(
    ("engine", "layout", "groups"),
    [
        (
            "sglang",
            "pd",
            "[prefill]\np1 ansible_host=fd00:100::1\np2 ansible_host=fd00:100::2\n"
            "[decode]\nd1 ansible_host=fd00:100::3\nd2 ansible_host=fd00:100::4\n",
        ),
        ("sglang", "tp", "[nodes]\nn1 ansible_host=fd00:100::1\nn2 ansible_host=fd00:100::2\n"),
        ("vllm", "tp", "[nodes]\nn1 ansible_host=fd00:100::1\nn2 ansible_host=fd00:100::2\n"),
        ("vllm", "dp_ep", "[nodes]\nn1 ansible_host=fd00:100::1\nn2 ansible_host=fd00:100::2\n"),
        ("ktransformers", "single", "[nodes]\nn1 ansible_host=fd00:100::1\n"),
    ],
)
def test_ipv6_is_bracketed_wherever_host_and_port_meet(
    tmp_path: Path, engine: str, layout: str, groups: str
) -> None:
    inv = write(tmp_path, f"{groups}[all:vars]\nk2_engine={engine}\nk2_layout={layout}\n")
    plan = build_plan(load_cluster(inv))
    texts = all_strings(plan)
    assert plan.endpoint.startswith("http://[fd00:100::")
    for text in texts:
        # An unbracketed address followed by :port ("fd00:100::1:5757") is never written.
        for n in range(1, 5):
            assert f"fd00:100::{n}:" not in text.replace(f"[fd00:100::{n}]:", ""), text
    # Servers listen on IPv6 too (::), never on the IPv4 wildcard alone.
    argv = [a for h in plan.hosts for p in h.processes for a in p.argv]
    assert "0.0.0.0" not in argv
    assert "::" in argv
    if engine == "sglang":
        assert any(t == "[fd00:100::1]:5757" for t in texts)


def test_plan_table_shows_addresses_as_written(tmp_path: Path, host_trap: HostTrap) -> None:
    inv = write(
        tmp_path,
        "[nodes]\nn1 ansible_host=fd00:100::1\nn2 ansible_host=fd00:100::2\n"
        "[all:vars]\nk2_engine=vllm\nk2_layout=tp\n",
    )
    code, out, _, _ = host_trap.run("plan", str(inv))
    assert code == 0
    assert "fd00:100::1" in out  # not an emoji for :100:
    assert "endpoint: http://[fd00:100::1]:8000" in out
