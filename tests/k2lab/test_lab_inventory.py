"""The lab's pure text: inventory (read back through Ansible's own loader), known_hosts,
the /etc/hosts block."""

from __future__ import annotations

from pathlib import Path

import pytest

from k2lab.errors import LabError
from k2lab.inventory import (
    HOSTS_BEGIN,
    HOSTS_END,
    INVENTORY_HEADER,
    InventoryHost,
    bastion_ssh_config,
    hosts_block,
    ini_value,
    known_hosts_text,
    layout_groups,
    parse_pairs,
    parse_var_value,
    render_inventory,
    update_hosts_file,
)

HOSTS = [InventoryHost(f"lab{i}", f"10.77.0.{10 + i}") for i in range(1, 5)]
NAMES = [h.name for h in HOSTS]


def render(**kwargs: object) -> str:
    args: dict[str, object] = {
        "instance": "k2lab",
        "ssh_port": 22,
        "private_key": "/lab/ssh/id_ed25519",
        "known_hosts": "/lab/instances/k2lab/known_hosts",
        "groups": layout_groups(NAMES, None),
    }
    args.update(kwargs)
    return render_inventory(HOSTS, **args)  # type: ignore[arg-type]


def load(text: str, tmp_path: Path) -> tuple[dict[str, list[str]], dict[str, dict[str, object]]]:
    """Parse with Ansible's InventoryManager, as ansible-playbook would."""
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader
    from ansible.vars.manager import VariableManager

    path = tmp_path / "lab.ini"
    path.write_text(text)
    loader = DataLoader()
    inventory = InventoryManager(loader=loader, sources=[str(path)])
    variables = VariableManager(loader=loader, inventory=inventory)
    groups = {name: [h.name for h in g.get_hosts()] for name, g in inventory.groups.items()}
    host_vars = {
        h.name: dict(variables.get_vars(host=h, include_hostvars=False))
        for h in inventory.get_hosts()
    }
    return groups, host_vars


def test_default_layout_puts_every_host_in_nodes() -> None:
    assert layout_groups(NAMES, None) == {"nodes": NAMES}


def test_counts_assign_hosts_in_order() -> None:
    assert layout_groups(NAMES, {"prefill": 1, "decode": 3}) == {
        "prefill": ["lab1"],
        "decode": ["lab2", "lab3", "lab4"],
    }
    assert layout_groups(NAMES, {"router": 1}) == {"router": ["lab1"]}


@pytest.mark.parametrize(
    ("counts", "message"),
    [
        ({"prefill": 3, "decode": 3}, "need 6 hosts but the lab has 4"),
        ({"bad-name": 1}, "not a usable inventory group name"),
        ({"all": 1}, "not a usable inventory group name"),
        ({"nodes": -1}, "must not be negative"),
    ],
)
def test_bad_layouts_are_refused(counts: dict[str, int], message: str) -> None:
    with pytest.raises(LabError, match=message):
        layout_groups(NAMES, counts)


def test_inventory_reads_back_through_ansible(tmp_path: Path) -> None:
    text = render()
    assert text.startswith(INVENTORY_HEADER)
    groups, host_vars = load(text, tmp_path)
    assert groups["nodes"] == NAMES
    lab2 = host_vars["lab2"]
    assert lab2["ansible_host"] == "10.77.0.12"
    assert lab2["ansible_port"] == 22
    assert lab2["ansible_user"] == "root"
    assert lab2["ansible_ssh_private_key_file"] == "/lab/ssh/id_ed25519"
    assert str(lab2["k2_lab"]).lower() == "true"
    args = str(lab2["ansible_ssh_common_args"])
    assert "UserKnownHostsFile=/lab/instances/k2lab/known_hosts" in args
    assert "StrictHostKeyChecking=yes" in args
    assert "StrictHostKeyChecking=no" not in text
    assert "lab_http_proxy" not in lab2


def test_proxy_url_is_offered_to_plays(tmp_path: Path) -> None:
    _, host_vars = load(render(proxy_url="http://10.77.0.1:3142"), tmp_path)
    assert host_vars["lab1"]["lab_http_proxy"] == "http://10.77.0.1:3142"


def test_groups_children_and_extra_vars(tmp_path: Path) -> None:
    text = render(
        ssh_port=2222,
        groups=layout_groups(NAMES, {"prefill": 2, "decode": 1}),
        children={"gpu": ["prefill", "decode"]},
        all_vars={"k2_engine": "sglang", "k2_context_length": 32768, "note": "two words"},
    )
    groups, host_vars = load(text, tmp_path)
    assert groups["prefill"] == ["lab1", "lab2"]
    assert groups["decode"] == ["lab3"]
    assert groups["gpu"] == ["lab1", "lab2", "lab3"]
    assert groups["ungrouped"] == ["lab4"]
    assert host_vars["lab4"]["ansible_port"] == 2222
    assert host_vars["lab1"]["k2_engine"] == "sglang"
    assert host_vars["lab1"]["k2_context_length"] == 32768
    assert host_vars["lab1"]["note"] == "two words"


def test_a_host_in_two_groups_carries_its_variables_once() -> None:
    text = render(groups={"nodes": NAMES, "router": ["lab1"]})
    assert text.count("ansible_host=10.77.0.11") == 1
    assert "[router]\nlab1\n" in text


def test_group_naming_an_unknown_host_is_refused() -> None:
    with pytest.raises(LabError, match="not a lab host"):
        render(groups={"nodes": ["lab9"]})


@pytest.mark.parametrize(
    ("value", "text"),
    [(True, "true"), (False, "false"), (8, "8"), ("sglang", "sglang"), ("a b", "'a b'")],
)
def test_ini_values(value: str | int | bool, text: str) -> None:
    assert ini_value(value) == text


def test_known_hosts_lines_pin_address_and_name() -> None:
    keys = [("lab1", "10.77.0.11", "ssh-ed25519 AAAA1"), ("lab2", "10.77.0.12", "ssh-ed25519 B")]
    assert known_hosts_text(keys, 22) == (
        "10.77.0.11,lab1 ssh-ed25519 AAAA1\n10.77.0.12,lab2 ssh-ed25519 B\n"
    )
    assert known_hosts_text(keys[:1], 2222) == "[10.77.0.11]:2222,[lab1]:2222 ssh-ed25519 AAAA1\n"
    assert known_hosts_text([], 22) == ""


def test_hosts_block_is_appended_then_replaced_in_place() -> None:
    base = "127.0.0.1\tlocalhost\n10.0.0.5\tdb\n"
    proxy = ("k2lab-proxy", "10.77.0.1")
    block2 = hosts_block([("lab1", "10.77.0.11"), ("lab2", "10.77.0.12")], proxy)
    once = update_hosts_file(base, block2)
    assert once.startswith(base)
    assert once.endswith(HOSTS_END + "\n")
    assert "10.77.0.12\tlab2" in once
    assert update_hosts_file(once, block2) == once  # idempotent

    block3 = hosts_block([("lab1", "10.77.0.11")], proxy)
    edited = once + "192.168.1.9\tadded-later\n"
    again = update_hosts_file(edited, block3)
    assert "lab2" not in again
    assert again.count(HOSTS_BEGIN) == 1
    assert "10.0.0.5\tdb" in again
    assert "added-later" in again


def test_hosts_block_on_a_file_without_final_newline() -> None:
    block = hosts_block([], ("k2lab-proxy", "10.77.0.1"))
    assert update_hosts_file("127.0.0.1 localhost", block) == "127.0.0.1 localhost\n" + block


def test_command_line_pairs_and_values() -> None:
    assert parse_pairs(["a=1", "b=x=y"], "--var") == {"a": "1", "b": "x=y"}
    with pytest.raises(LabError, match="--var 'bad': expected NAME=VALUE"):
        parse_pairs(["bad"], "--var")
    assert parse_var_value("True") is True
    assert parse_var_value("8") == 8
    assert parse_var_value("pd") == "pd"


def test_a_bastion_inventory_reaches_every_host_through_the_jump_host(tmp_path: Path) -> None:
    text = render(jump=("/lab/instances/k2lab/ssh_config", "bastion"))
    _, host_vars = load(text, tmp_path)
    args = str(host_vars["lab1"]["ansible_ssh_common_args"])
    assert args.startswith("-F /lab/instances/k2lab/ssh_config -o ProxyJump=bastion -o ")
    assert "UserKnownHostsFile=/lab/instances/k2lab/known_hosts" in args
    assert "ProxyJump" not in render()


def test_the_bastion_ssh_config_pins_its_key_and_host_key() -> None:
    text = bastion_ssh_config("bastion", "10.77.0.210", 22, "/lab/id", "/lab/known_hosts")
    lines = [line.strip() for line in text.splitlines()]
    for expected in (
        "Host bastion",
        "HostName 10.77.0.210",
        "IdentityFile /lab/id",
        "UserKnownHostsFile /lab/known_hosts",
        "StrictHostKeyChecking yes",
    ):
        assert expected in lines


def test_hosts_behind_a_bastion_refuse_ssh_from_anywhere_else() -> None:
    from k2lab.config import LabConfig
    from k2lab.hosts import init_script

    cfg = LabConfig.default()
    rule = "iptables -A INPUT -p tcp --dport 22 ! -s 10.77.0.210 -j REJECT --reject-with tcp-reset"
    assert rule.replace("22", str(cfg.ssh_port), 1) in init_script(cfg, "lab1", "10.77.0.210")
    assert "iptables" not in init_script(cfg, "lab1")
