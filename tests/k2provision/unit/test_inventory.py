"""Inventory -> Cluster: the group contract, variables, and one clear line per problem."""

from __future__ import annotations

from pathlib import Path

import pytest

from k2provision.errors import InventoryError
from k2provision.plan.inventory import load_cluster

ROOT = Path(__file__).resolve().parents[3]


def write(tmp_path: Path, text: str, name: str = "inv.ini") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def problems(path: Path) -> list[str]:
    """The inventory's problems; each names the fix (the tests check the rest of each line)."""
    with pytest.raises(InventoryError, match=r"; fix: ") as info:
        load_cluster(path)
    assert all("; fix: " in line for line in info.value.problems), info.value.problems
    return list(info.value.problems)


def test_prod_inventory_is_4p12d_sglang() -> None:
    cluster = load_cluster(ROOT / "inventory" / "prod.ini")
    assert cluster.engine == "sglang"
    assert cluster.layout == "pd"
    assert [h.name for h in cluster.pool("prefill")] == [f"gpu-p0{i}" for i in range(1, 5)]
    assert len(cluster.pool("decode")) == 12
    assert cluster.router == "gpu-p01"
    assert cluster.host("gpu-d03").address == "10.10.0.23"
    assert cluster.host("gpu-d03").ib_devices[0] == "mlx5_0"
    assert cluster.gpus_per_node == 8


def test_group_vars_and_host_vars_are_read_through_ansible(tmp_path: Path) -> None:
    (tmp_path / "group_vars").mkdir()
    (tmp_path / "group_vars" / "all.yml").write_text(
        "k2_engine: vllm\nk2_layout: dp_ep\nk2_ib_devices: [mlx5_0, mlx5_3]\n"
    )
    inv = write(tmp_path, "[nodes]\na ansible_host=10.0.0.1 k2_local_ip=192.168.0.1\nb\n")
    cluster = load_cluster(inv)
    assert cluster.engine == "vllm"
    assert cluster.host("a").local_ip == "192.168.0.1"
    assert cluster.host("b").address == "b"
    assert cluster.host("b").ib_devices == ("mlx5_0", "mlx5_3")


def test_missing_file_names_the_path(tmp_path: Path) -> None:
    (line,) = problems(tmp_path / "nope.ini")
    assert "nope.ini" in line
    assert "no such inventory file" in line


def test_unparseable_file_is_one_clear_line(tmp_path: Path) -> None:
    (line,) = problems(write(tmp_path, "[nodes\nhost a=\n"))
    assert "not a valid INI inventory" in line
    assert "fix:" in line


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[nodes]\na\n[all:vars]\nk2_engine=tgi\nk2_layout=tp\n", "k2_engine=tgi is not an engine"),
        (
            "[nodes]\na\n[all:vars]\nk2_engine=sglang\nk2_layout=tp_pp\n",
            "k2_layout=tp_pp is not a sglang layout",
        ),
        ("[prefill]\na\n[all:vars]\nk2_engine=sglang\nk2_layout=pd\n", "needs hosts in [decode]"),
        (
            "[prefill]\na\n[decode]\na\n[all:vars]\nk2_engine=sglang\nk2_layout=pd\n",
            "host a is in both [prefill] and [decode]",
        ),
        (
            "[nodes]\na ansible_host=10.0.0.1\nb ansible_host=10.0.0.1\n[all:vars]\n"
            "k2_engine=vllm\nk2_layout=tp\n",
            "address 10.0.0.1 is also a's",
        ),
        (
            "[nodes]\na\n[all:vars]\nk2_engine=vllm\nk2_layout=tp\nk2_gpus_per_nod=8\n",
            "did you mean k2_gpus_per_node?",
        ),
        (
            "[nodes]\na\nb\n[all:vars]\nk2_engine=ktransformers\nk2_layout=single\n",
            "runs on exactly one host",
        ),
        (
            "[nodes]\na\n[all:vars]\nk2_engine=vllm\nk2_layout=tp\nk2_gpus_per_node=0\n",
            "k2_gpus_per_node=0",
        ),
        ("[web]\na\n", "no hosts in [nodes], [prefill] or [decode]"),
        (
            "[nodes]\na k2_engine=sglang\nb k2_engine=vllm\n[all:vars]\nk2_layout=tp\n",
            "expected one value for the whole cluster",
        ),
    ],
)
def test_bad_inventory_is_refused_with_a_fix(tmp_path: Path, text: str, expected: str) -> None:
    found = problems(write(tmp_path, text))
    assert any(expected in line for line in found), found
    assert all("fix:" in line for line in found), found


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    found = problems(
        write(
            tmp_path,
            "[prefill]\na ansible_host=10.0.0.1\n[decode]\na\nb ansible_host=10.0.0.1\n"
            "[all:vars]\nk2_engine=sglang\nk2_layout=pd\nk2_egnine=x\n",
        )
    )
    assert len(found) == 3, found


def test_role_variables_and_playbook_internals_are_known(tmp_path: Path) -> None:
    inv = write(
        tmp_path,
        "[nodes]\na\nb\n[all:vars]\nk2_engine=vllm\nk2_layout=tp\n"
        "k2_launch_gate_delay=2\nk2_expected_plan_digest=abc\n",
    )
    assert load_cluster(inv).engine == "vllm"
    bad = write(
        tmp_path,
        "[nodes]\na\n[all:vars]\nk2_engine=vllm\nk2_layout=tp\nk2_launchh_gate_delay=2\n",
        "bad.ini",
    )
    assert any("unknown variable k2_launchh_gate_delay" in p for p in problems(bad))
