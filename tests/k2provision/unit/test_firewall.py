"""The k2_firewall role's ruleset (core/firewall.py): the endpoint's port from anywhere, SSH,
the cluster's own addresses and the trusted subnets accepted, the rest dropped; and nft
itself accepts the file (`nft -c`, Debian's nftables: scripts/install-lab-deps)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from k2provision.core.firewall import ruleset
from tests.golden_cases import expected_path

ROOT = Path(__file__).resolve().parents[3]


def _plan(case: str) -> dict[str, Any]:
    plan: dict[str, Any] = json.loads(expected_path(case).read_text())["plan"]
    return plan


def _endpoint_host(plan: dict[str, Any]) -> str:
    return str(plan["endpoint_host"])


def test_the_endpoint_host_opens_the_endpoint_and_ssh_and_trusts_the_cluster() -> None:
    plan = _plan("sglang-pd-1p1d")
    text = ruleset(plan, _endpoint_host(plan), [22, 2200], ["10.9.0.0/16", "not-an-address"])
    assert 'tcp dport { 22, 2200 } accept comment "SSH"' in text
    assert 'tcp dport { 8000 } accept comment "the endpoint"' in text
    assert "policy drop;" in text
    addresses = {a for h in plan["hosts"] for a in (h["address"], h["local_ip"])}
    for address in addresses:
        assert f"{address}/32" in text
    assert "10.9.0.0/16" in text
    assert "not-an-address" not in text
    assert "peers_v6" not in text
    # Replaced whole on every load: the table is created, deleted, then defined.
    assert text.index("delete table inet k2provision") < text.index("table inet k2provision {")


def test_other_hosts_open_only_ssh_to_the_world() -> None:
    plan = _plan("sglang-pd-1p1d")
    other = next(h["name"] for h in plan["hosts"] if h["name"] != _endpoint_host(plan))
    text = ruleset(plan, other, [22])
    assert "the endpoint" not in text
    assert 'tcp dport { 22 } accept comment "SSH"' in text


def test_ipv6_peers_go_in_their_own_set() -> None:
    plan = _plan("sglang-pd-ipv6")
    text = ruleset(plan, _endpoint_host(plan), [22])
    assert "ip6 saddr @peers_v6 accept" in text
    assert "ip saddr @peers_v4" not in text


def test_a_host_outside_the_plan_is_refused() -> None:
    with pytest.raises(ValueError, match="nowhere is in no pool of the plan"):
        ruleset(_plan("sglang-tp"), "nowhere", [22])


@pytest.mark.parametrize("case", ["sglang-pd-1p1d", "sglang-pd-ipv6", "vllm-tp16"])
def test_nft_accepts_the_ruleset(case: str, tmp_path: Path) -> None:
    nft = shutil.which("nft") or "/usr/sbin/nft"
    assert Path(nft).exists(), "nft is missing: scripts/install-lab-deps installs nftables"
    plan = _plan(case)
    path = tmp_path / "k2provision.nft"
    path.write_text(ruleset(plan, _endpoint_host(plan), [22], ["10.0.0.0/8", "fd00::/8"]))
    result = subprocess.run([nft, "-c", "-f", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_the_role_loads_the_file_it_checks_with_the_filter_of_this_module() -> None:
    tasks = (ROOT / "roles/k2_firewall/tasks/main.yml").read_text()
    assert "k2.cluster.firewall_ruleset(" in tasks
    assert "validate: nft -c -f %s" in tasks
    prepare = (ROOT / "playbooks/prepare.yml").read_text()
    assert 'k2_firewall_plan: "{{ k2_planned.plan }}"' in prepare
