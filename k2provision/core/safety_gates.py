"""Safety gates an inventory line can switch off: the role variables that skip or blind a check
the run relies on (the GPU health gate, the hardware checks, the disk and RDMA thresholds, the
ssh mesh check), judged against where the inventory runs.

The lab is an inventory whose `k2_lab` is true (what `k2provision lab up` writes in its
`[all:vars]`; nothing else, no host name or address, marks one): there these switches are the
lab's business. Elsewhere, a variable that replaces the hosts' facts with given text is
refused, and every other switch is a warning line that the plan carries in its warnings (with
SWITCHED_OFF first) and every run keeps in its record.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from k2provision.core import role_specs
from k2provision.core.variables import shorten_hosts, show

# Every warning line of a switched-off gate starts so: the run's summary finds them by it.
SWITCHED_OFF = "SAFETY GATE OFF"
# How much of a switch's value a line shows.
SHOWN_CHARS = 80


@dataclass(frozen=True)
class Gate:
    """One switch: which values turn the gate off, and what the run then no longer checks."""

    off: str
    """"false": a boolean turned false; "zero": a threshold set to 0; "set": any value but
    the empty default (the variable replaces what the run observes)."""
    what: str
    """What is no longer checked."""


GATES: dict[str, Gate] = {
    "k2_preflight_facts_override": Gate(
        "set",
        "preflight judges the given command outputs instead of the hosts' own (GPU model and "
        "health, DCGM, driver, RDMA ports, disk, ports, clock)",
    ),
    "k2_preflight_require_dcgm": Gate(
        "false", "a GPU host whose DCGM diagnostic gives nothing passes the GPU health gate"
    ),
    "k2_preflight_hardware": Gate(
        "false", "preflight skips the GPU, driver, fabric manager and RDMA port checks"
    ),
    "k2_preflight_require_clock_sync": Gate(
        "false", "a host whose clock synchronization cannot be read passes preflight"
    ),
    "k2_preflight_require_persistence_mode": Gate(
        "false", "GPUs out of persistence mode pass preflight"
    ),
    "k2_preflight_disk_gib": Gate("zero", "preflight no longer checks room for the weights"),
    "k2_preflight_min_active_ib_ports": Gate(
        "zero", "a host with no Active RDMA port passes preflight"
    ),
    "k2_preflight_ib_rate_gbps": Gate("zero", "RDMA ports at any link rate pass preflight"),
    "k2_ssh_mesh_verify": Gate("false", "the ssh mesh between the hosts is not checked"),
    "k2_nvidia_driver_hardware": Gate(
        "false", "the driver role skips the driver, fabric manager and persistence steps"
    ),
    "k2_rdma_hardware": Gate("false", "the RDMA role skips the RDMA devices and memlock steps"),
    "k2_container_runtime_hardware": Gate(
        "false", "the container runtime role skips the NVIDIA runtime's GPU steps"
    ),
    "k2_nccl_check_hardware": Gate(
        "false", "the NCCL check runs without GPUs, so it measures no bandwidth"
    ),
}
# Switches refused outside the lab: they replace what the run observes, so every gate after
# them judges invented hosts.
REFUSED_OFF_LAB = ("k2_preflight_facts_override",)


def _switched_off(gate: Gate, value: Any) -> bool:
    from ansible.module_utils.parsing.convert_bool import boolean

    if role_specs.is_template(value):
        return True  # known only at run time: warned, as it may be off
    if gate.off == "set":
        return value not in (None, {}, "")
    if gate.off == "false":
        try:
            return not boolean(value, strict=True)
        except TypeError:
            return False  # not a boolean: the role's argument check refuses it
    try:
        return float(value) == 0
    except (TypeError, ValueError):
        return False


def _shown(value: Any) -> str:
    """A value as the inventory writes it, cut short (command outputs run to pages)."""
    text = show(value)
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 3] + "..."


def gate_lines(
    host_vars: Mapping[str, Mapping[str, Any]], lab: bool
) -> tuple[list[str], list[str]]:
    """(refusals, warnings) for the gates the inventory switches off; none in the lab. One
    line per variable and value, naming its hosts."""
    if lab:
        return [], []
    found: dict[tuple[str, str], list[str]] = {}
    for host, variables in host_vars.items():
        for name, gate in GATES.items():
            if name in variables and _switched_off(gate, variables[name]):
                found.setdefault((name, _shown(variables[name])), []).append(host)
    refusals: list[str] = []
    warnings: list[str] = []
    for (name, value), hosts in found.items():
        gate = GATES[name]
        template = "{{" in value or "{%" in value
        state = " (a template: it may turn the gate off at run time)" if template else ""
        if name in REFUSED_OFF_LAB:
            refusals.append(
                f"{shorten_hosts(hosts)}: {name}={value} outside the lab (k2_lab is false): "
                f"{gate.what}; expected it unset on a real cluster (it is for tests and offline "
                "audits, in a play's vars); fix: remove it from the inventory"
            )
        else:
            warnings.append(
                f"{SWITCHED_OFF}: {shorten_hosts(hosts)}: {name}={value}{state}: {gate.what} "
                f"(k2_lab is false); remove {name} to keep the gate"
            )
    return refusals, warnings
