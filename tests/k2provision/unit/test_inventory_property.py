"""Inventories generated from the contract's grammar, valid and broken, as INI or YAML.

Each either plans (exit 0, JSON) or is refused (exit 2, only `error:` lines); never a traceback,
and never exit 0 when the generator broke a rule: every broken rule's variable or host is named.
The group shapes, addresses, booleans and context lengths are the generator's own rules; the
tunables' ranges and choices are read from their declaration in models.py (the contract itself;
test_inventory_values checks that every number has one), so this proves they are enforced.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from itertools import count
from pathlib import Path
from typing import Any, get_args

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from k2provision.core.records import Tunables
from k2provision.engines import REGISTRY
from k2provision.engines.base import layout_names
from tests.k2provision.unit.contract_support import HostTrap

# Valid ports come from here, ten apart: clear of every default port and of each other
# (SGLang's rendezvous takes seven consecutive ports).
PORT_BASE = 40000
# Each registered engine's layouts by name.
LAYOUTS = {name: layout_names(engine.LAYOUTS) for name, engine in REGISTRY.items()}
WORDS = ("fp8", "kimi", "bond0", "img:1", "auto")
_examples = count()


@dataclass
class Inventory:
    """A generated inventory and the names its broken rules must be refused with."""

    groups: dict[str, list[str]]
    host_vars: dict[str, dict[str, Any]]
    all_vars: dict[str, Any]
    broken: list[str] = field(default_factory=list)

    def ini(self) -> str:
        lines, placed = [], set()
        for group, hosts in self.groups.items():
            lines.append(f"[{group}]")
            for host in hosts:
                hv = (
                    ""
                    if host in placed
                    else " ".join(f"{k}={v}" for k, v in self.host_vars.get(host, {}).items())
                )
                lines.append(f"{host} {hv}".strip())
                placed.add(host)
        lines.append("[all:vars]")
        lines += [f"{k}={_ini(v)}" for k, v in self.all_vars.items()]
        return "\n".join(lines) + "\n"

    def yaml(self) -> str:
        children = {
            group: {"hosts": {h: self.host_vars.get(h) or None for h in hosts}}
            for group, hosts in self.groups.items()
        }
        return yaml.safe_dump({"all": {"vars": self.all_vars, "children": children}})


def _ini(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return "''" if value == "" else str(value)


def _tunable_value(draw: st.DrawFn, name: str, ports: list[int], inv: Inventory) -> Any:
    """A valid value for a tunable, or (sometimes) a broken one, recorded in inv.broken."""
    f = Tunables.model_fields[name]
    var = f"k2_{name}"
    annotation = f.annotation
    choices = get_args(annotation) if "Literal" in str(annotation) else ()
    low = high = None
    for m in f.metadata:
        low = getattr(m, "ge", low)
        high = getattr(m, "le", high)
    broken = draw(st.integers(0, 3)) == 3  # hypothesis starts from 0: valid first
    if choices:
        value = "bogus" if broken else draw(st.sampled_from(choices))
    elif low is not None and high is not None:
        if broken:
            value = draw(st.sampled_from([low - 1, high + 1, "many", True]))
        elif name.endswith("_port"):
            value = ports.pop()
        else:
            value = draw(st.integers(int(low), int(min(high, 10**6))))
    elif name == "config_dir":
        value = draw(st.sampled_from(["etc/k2", "/etc/../x", "/a b"])) if broken else "/etc/k2x"
    else:
        value = draw(st.sampled_from(["", "two words"])) if broken else draw(st.sampled_from(WORDS))
    if broken:
        inv.broken.append(var)
    return value


@st.composite
def inventories(draw: st.DrawFn) -> Inventory:
    engine = draw(st.sampled_from([*LAYOUTS, *LAYOUTS, *LAYOUTS, "tgi"]))
    layouts = LAYOUTS.get(engine, ())
    layout = draw(st.sampled_from([*layouts, *layouts, *layouts, "zigzag"]))
    inv = Inventory(groups={}, host_vars={}, all_vars={"k2_engine": engine, "k2_layout": layout})
    contract_ok = engine in LAYOUTS and layout in LAYOUTS[engine]
    if engine not in LAYOUTS:
        inv.broken.append("k2_engine=tgi")
    elif not contract_ok:
        inv.broken.append("k2_layout=zigzag")
    addresses = count(1)
    pools = ("prefill", "decode") if layout == "pd" else ("nodes",)
    for pool in pools:
        size = draw(st.sampled_from([2, 3, 2, 1]))
        inv.groups[pool] = [f"{pool[0]}{i}" for i in range(1, size + 1)]
        for host in inv.groups[pool]:
            bad = draw(st.sampled_from([None] * 14 + ["10.9.0.300", "10.9.0.7:22"]))
            inv.host_vars[host] = {"ansible_host": bad or f"10.9.0.{next(addresses)}"}
            if bad:
                inv.broken.append(f"{host}: ansible_host={bad}")
    if contract_ok and layout == "single" and len(inv.groups["nodes"]) != 1:
        inv.broken.append("exactly one host")
    routers = draw(st.sampled_from([0, 0, 0, 1, 2]))
    if routers:
        inv.groups["router"] = ["r1", "r2"][:routers]
        for host in inv.groups["router"]:
            inv.host_vars[host] = {"ansible_host": f"10.9.1.{next(addresses)}"}
        if contract_ok and (layout != "pd" or routers > 1):
            inv.broken.append("[router]")
    ports = [PORT_BASE + 10 * i for i in range(len(Tunables.model_fields))]
    names = [n for n in Tunables.model_fields if n != "model_config_json"]
    for name in draw(st.lists(st.sampled_from(names), unique=True, max_size=4)):
        inv.all_vars[f"k2_{name}"] = _tunable_value(draw, name, ports, inv)
    if draw(st.booleans()):
        lab = draw(st.sampled_from(["true", "false", "yes", "ture"]))
        inv.all_vars["k2_lab"] = lab
        if lab == "ture":
            inv.broken.append("k2_lab=ture")
    if draw(st.booleans()):
        context = draw(st.sampled_from([65536, 4096, 131072, 8192, 0, -5]))
        inv.all_vars["k2_context_length"] = context
        if context < 1:
            inv.broken.append(f"k2_context_length={context}")
    if draw(st.integers(0, 5)) == 5:
        inv.all_vars["k2_gpus_per_nodes"] = 8
        inv.broken.append("k2_gpus_per_nodes")
    return inv


@settings(
    max_examples=80,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(inv=inventories(), form=st.sampled_from(["ini", "yaml"]))
def test_every_inventory_plans_or_is_refused_line_by_line(
    inv: Inventory, form: str, tmp_path: Path, host_trap: HostTrap
) -> None:
    suffix = "ini" if form == "ini" else "yml"
    path = tmp_path / f"example-{next(_examples)}" / f"inventory.{suffix}"
    path.parent.mkdir()
    path.write_text(inv.ini() if form == "ini" else inv.yaml())
    code, out, err, unexpected = host_trap.run("plan", str(path), "--format", "json")
    assert unexpected is None, unexpected
    assert "Traceback" not in out + err
    assert code in (0, 2), (code, err)
    if code == 0:
        assert inv.broken == [], (inv.broken, path.read_text())
        plan = json.loads(out)
        assert {h["name"] for h in plan["hosts"]} == {
            h for hosts in inv.groups.values() for h in hosts
        }
        return
    lines = err.splitlines()
    assert lines, err
    assert all(line.startswith("error: ") for line in lines), err
    for name in inv.broken:
        assert any(name in line for line in lines), (name, err, path.read_text())
