"""Every Ansible inventory form, read as Ansible reads it: INI, YAML, a directory of sources.

The same cluster written three ways plans to byte-identical JSON, and for each form
`ansible-inventory --list` and k2provision agree on groups, their order and the variables.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from k2provision.core.inventory import read_inventory
from k2provision.plan.assemble import build_plan, plan_digest
from k2provision.plan.inventory import load_cluster
from tests.k2provision.unit.contract_support import HostTrap

ROOT = Path(__file__).resolve().parents[3]
CLUSTER_VARS = {
    "k2_engine": "sglang",
    "k2_layout": "pd",
    "k2_context_length": 65536,
    "k2_served_model_name": "kimi",
    "k2_decode_redundant_experts": 16,
}
INI = """\
[prefill]
p1 ansible_host=10.1.0.1 k2_ib_devices=mlx5_0,mlx5_1
p2 ansible_host=10.1.0.2
[rack_b]
d2 ansible_host=10.1.0.12
[rack_a]
d1 ansible_host=10.1.0.11
[decode:children]
rack_a
rack_b
[router]
p2
[all:vars]
""" + "".join(f"{k}={v}\n" for k, v in CLUSTER_VARS.items())
YAML = {
    "all": {
        "vars": CLUSTER_VARS,
        "children": {
            "prefill": {
                "hosts": {
                    "p1": {"ansible_host": "10.1.0.1", "k2_ib_devices": ["mlx5_0", "mlx5_1"]},
                    "p2": {"ansible_host": "10.1.0.2"},
                }
            },
            "rack_b": {"hosts": {"d2": {"ansible_host": "10.1.0.12"}}},
            "rack_a": {"hosts": {"d1": {"ansible_host": "10.1.0.11"}}},
            "decode": {"children": {"rack_a": {}, "rack_b": {}}},
            "router": {"hosts": {"p2": {}}},
        },
    }
}


def write_forms(tmp_path: Path) -> dict[str, Path]:
    """The cluster as one INI file, one YAML file, and a directory of two sources + vars."""
    (tmp_path / "ini").mkdir()
    (tmp_path / "ini" / "cluster.ini").write_text(INI)
    (tmp_path / "yaml").mkdir()
    (tmp_path / "yaml" / "cluster.yml").write_text(json.dumps(YAML, indent=1))
    inv = tmp_path / "dir" / "cluster"
    for sub in ("group_vars", "host_vars"):
        (inv / sub).mkdir(parents=True)
    (inv / "10-prefill.ini").write_text("[prefill]\np1\np2\n[router]\np2\n")
    (inv / "20-decode.yml").write_text(
        "all:\n  children:\n    rack_b:\n      hosts:\n        d2:\n    rack_a:\n      hosts:\n"
        "        d1:\n    decode:\n      children:\n        rack_a:\n        rack_b:\n"
    )
    (inv / "README.md").write_text("Ansible skips this file by its extension.\n")
    (inv / "group_vars" / "all.yml").write_text(json.dumps(CLUSTER_VARS))
    for host, address in (("p1", "10.1.0.1"), ("p2", "10.1.0.2"), ("d1", "10.1.0.11")):
        (inv / "host_vars" / f"{host}.yml").write_text(f"ansible_host: {address}\n")
    (inv / "host_vars" / "p1.yml").write_text(
        "ansible_host: 10.1.0.1\nk2_ib_devices: mlx5_0,mlx5_1\n"
    )
    (inv / "host_vars" / "d2").mkdir()
    (inv / "host_vars" / "d2" / "address.yml").write_text("ansible_host: 10.1.0.12\n")
    return {
        "ini": tmp_path / "ini" / "cluster.ini",
        "yaml": tmp_path / "yaml" / "cluster.yml",
        "dir": inv,
    }


def test_three_forms_plan_to_identical_json(tmp_path: Path, host_trap: HostTrap) -> None:
    outputs = {}
    for form, path in write_forms(tmp_path).items():
        code, out, err, unexpected = host_trap.run("plan", str(path), "--format", "json")
        assert (code, err, unexpected) == (0, "", None), (form, err)
        outputs[form] = out
    assert outputs["ini"] == outputs["yaml"] == outputs["dir"]
    plan = json.loads(outputs["ini"])
    assert [(h["name"], h["role"], h["node_rank"]) for h in plan["hosts"]] == [
        ("p1", "prefill", 0),
        ("p2", "prefill", 1),
        ("d1", "decode", 0),
        ("d2", "decode", 1),
    ]
    assert plan["endpoint"] == "http://10.1.0.2:8000"  # the [router] host


def ansible_inventory_view(path: Path) -> tuple[dict[str, list[str]], dict[str, dict[str, Any]]]:
    """Groups (own hosts, then children's, as a play's `groups` has them) and k2 variables,
    from `ansible-inventory --list`."""
    listed = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-inventory"), "-i", str(path), "--list"],
        check=True,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    doc = json.loads(listed.stdout)

    def hosts(group: str) -> list[str]:
        entry = doc.get(group, {})
        found = list(entry.get("hosts", []))
        for child in entry.get("children", []):
            found += [h for h in hosts(child) if h not in found]
        return found

    names = [g for g in doc if g != "_meta"]
    variables = {
        host: {k: v for k, v in hv.items() if k.startswith("k2_") or k == "ansible_host"}
        for host, hv in doc["_meta"]["hostvars"].items()
    }
    return {g: hosts(g) for g in names}, variables


@pytest.mark.parametrize("form", ["ini", "yaml", "dir"])
def test_ansible_inventory_and_k2provision_agree(tmp_path: Path, form: str) -> None:
    path = write_forms(tmp_path)[form]
    groups, host_vars = read_inventory(path)
    expected_groups, expected_vars = ansible_inventory_view(path)
    for group in ("prefill", "decode", "router", "rack_a", "rack_b"):
        assert groups[group] == expected_groups[group], group
    assert groups["decode"] == ["d1", "d2"]
    assert host_vars == expected_vars


def test_rank_zero_is_the_first_host_of_the_pool_group(tmp_path: Path) -> None:
    """`[rack_b] n2`, `[rack_a] n1`, `[nodes] n1 n2`: n2 comes first in the file, n1 in
    [nodes] (and in `ansible-inventory --graph nodes`)."""
    inv = tmp_path / "racks.ini"
    inv.write_text(
        "[rack_b]\nn2 ansible_host=10.0.0.2\n[rack_a]\nn1 ansible_host=10.0.0.1\n"
        "[nodes]\nn1\nn2\n[all:vars]\nk2_engine=vllm\nk2_layout=tp\n"
    )
    plan = build_plan(load_cluster(inv))
    assert plan.pools[0].master == "n1"
    assert plan.host("n1").node_rank == 0
    assert plan.endpoint == "http://10.0.0.1:8000"


def test_default_router_is_the_first_host_of_prefill(tmp_path: Path) -> None:
    inv = tmp_path / "pd.ini"
    inv.write_text(
        "[decode]\nd1 ansible_host=10.0.0.11\nd2 ansible_host=10.0.0.12\n"
        "[other]\np2 ansible_host=10.0.0.2\n"
        "[prefill]\np1 ansible_host=10.0.0.1\np2\n[all:vars]\nk2_engine=sglang\nk2_layout=pd\n"
    )
    cluster = load_cluster(inv)
    assert cluster.router == "p1"
    assert build_plan(cluster).endpoint == "http://10.0.0.1:8000"


def test_relative_model_config_json_is_read_beside_the_inventory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = json.loads((ROOT / "tests" / "engine_parsers" / "kimi_k2_config.json").read_text())
    config["max_position_embeddings"] = 65536
    forms = write_forms(tmp_path)
    for path in forms.values():
        base = path if path.is_dir() else path.parent
        (base / "mirror").mkdir()
        (base / "mirror" / "config.json").write_text(json.dumps(config))
    forms["ini"].write_text(
        INI.replace("k2_context_length=65536\n", "k2_model_config_json=mirror/config.json\n")
    )
    dir_vars = {k: v for k, v in CLUSTER_VARS.items() if k != "k2_context_length"}
    (forms["dir"] / "group_vars" / "all.yml").write_text(
        json.dumps({**dir_vars, "k2_model_config_json": "mirror/config.json"})
    )
    monkeypatch.chdir("/")
    ini_cluster = load_cluster(forms["ini"])
    assert ini_cluster.tunables.model_config_json == str(forms["ini"].parent / "mirror/config.json")
    assert build_plan(ini_cluster).fit[0].context_length == 65536
    dir_tunables = load_cluster(forms["dir"]).tunables
    assert dir_tunables.model_config_json == str(forms["dir"] / "mirror" / "config.json")


SHOW_DIGEST = """\
- name: Plan
  import_playbook: {plan}
- name: Show the plan's digest
  hosts: all
  gather_facts: false
  tasks:
    - name: Digest
      ansible.builtin.debug:
        msg: "DIGEST={{{{ k2_planned.digest }}}}"
      run_once: true
      delegate_to: localhost
"""


@pytest.mark.parametrize("form", ["ini", "yaml", "dir"])
def test_ansible_playbook_plans_the_same_from_every_form(
    tmp_path: Path, form: str, host_trap: HostTrap
) -> None:
    """The other door: k2.cluster.plan inside ansible-playbook reads the same inventory form
    into the same plan, without contacting a host."""
    path = write_forms(tmp_path)[form]
    playbook = tmp_path / "show.yml"
    playbook.write_text(SHOW_DIGEST.format(plan=ROOT / "playbooks" / "plan.yml"))
    run = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(path), str(playbook)],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"DIGEST={plan_digest(build_plan(load_cluster(path)))}" in run.stdout
