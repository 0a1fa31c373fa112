"""Host facts: pure parsers turning command output into frozen, typed records.

Each parser takes the text a command printed on a host and returns a record; nothing here runs
a command, opens a socket or imports ansible. The preflight play collects the text, these
functions read it, and ``preflight.py`` judges it.

Commands and their parsers:

- ``nvidia-smi -q -x``: :func:`parse_nvidia_smi_xml`
- ``nvidia-smi topo -m``: :func:`parse_nvidia_smi_topo` (then :func:`nearest_nics`)
- ``ibstat``: :func:`parse_ibstat`; ``ibv_devinfo [-v]``: :func:`parse_ibv_devinfo`
- ``df -B1 --output=avail DIR`` (or ``df -B1 DIR``): :func:`parse_df_bytes`
- ``ss -Hltn``: :func:`parse_listening_ports`
- ``timedatectl show``, ``timedatectl`` or ``chronyc tracking``: :func:`parse_clock_sync`
- ``cat /etc/os-release``: :func:`parse_os_release`; ``uname -r``: :func:`parse_kernel_release`
- ``systemctl is-active nvidia-fabricmanager`` (or ``status``): :func:`parse_service_state`
- ``du -s -B1 DIR``: :func:`parse_du_bytes`
- ``docker ps --format '{{.Names}}'``: :func:`parse_names`

:data:`FACT_COMMANDS` pairs each command with its parser, once, for every role that reads a host
(preflight, the driver's and the RDMA role's checks): the command, how messages name it, the
parser, and whether it needs GPUs or HCAs.

Malformed input raises :class:`FactParseError`, whose message names the command and what is wrong.
"""

from __future__ import annotations

import re
import shlex
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict

from k2provision.core.gpu_health import (
    DCGM_FIX,
    DRIVER_LOAD_MARK,
    DiagResult,
    NvLink,
    XidEvent,
    memory_health,
    parse_dcgm_diag,
    parse_nvlink_status,
    xids_since_driver_load,
)

__all__ = [
    "DEFAULT_DIAG_LEVEL",
    "DIAG_LEVEL",
    "DIAG_LEVELS",
    "FACTS",
    "FACT_COMMANDS",
    "LINK_RANK",
    "MODEL_DIR",
    "ClockSync",
    "FactCommand",
    "FactParseError",
    "Gpu",
    "GpuInventory",
    "HostFacts",
    "IbPort",
    "ListeningSocket",
    "OsRelease",
    "ServiceState",
    "TopoGpu",
    "TopoNic",
    "Topology",
    "bound_ports",
    "nearest_nics",
    "nic_per_gpu",
    "parse_clock_sync",
    "parse_df_bytes",
    "parse_du_bytes",
    "parse_ibstat",
    "parse_ibv_devinfo",
    "parse_kernel_release",
    "parse_listening_ports",
    "parse_names",
    "parse_nvidia_smi_topo",
    "parse_nvidia_smi_xml",
    "parse_os_release",
    "parse_service_state",
]


class FactParseError(ValueError):
    """The text is not what the named command prints; the message says which line and why."""


class Fact(BaseModel):
    """Base of the fact records: immutable, strict about keys."""

    model_config = ConfigDict(frozen=True, extra="forbid")


# ---------------------------------------------------------------- nvidia-smi -q -x


class Gpu(Fact):
    """One GPU as ``nvidia-smi -q -x`` reports it."""

    index: int
    """Position in nvidia-smi's enumeration (PCI bus order), the index CUDA and ``-i`` use."""
    product_name: str
    pci_bus_id: str
    uuid: str
    memory_total_mib: int
    persistence_mode: bool | None
    ecc_current: bool | None
    architecture: str | None = None
    minor_number: int | None = None
    vbios_version: str | None = None
    fabric_state: str | None = None
    """NVSwitch fabric registration (``Completed``, ``In Progress``...); None where N/A."""
    fabric_status: str | None = None
    uncorrectable_ecc: int = 0
    """Volatile uncorrectable ECC errors (since the driver loaded)."""
    row_remap_pending: bool = False
    row_remap_failure: bool = False


class GpuInventory(Fact):
    """Driver and GPUs of one host."""

    driver_version: str
    cuda_version: str | None
    gpus: tuple[Gpu, ...]

    @property
    def count(self) -> int:
        """How many GPUs the driver sees."""
        return len(self.gpus)

    @property
    def products(self) -> tuple[str, ...]:
        """Distinct product names, in order of first appearance."""
        return tuple(dict.fromkeys(g.product_name for g in self.gpus))


def _text(elem: ET.Element, path: str) -> str | None:
    found = elem.find(path)
    if found is None or found.text is None:
        return None
    value = found.text.strip()
    return value or None


def _known(value: str | None) -> str | None:
    """nvidia-smi writes N/A (or a variant) where a value does not apply."""
    if value is None or value.upper() in {"N/A", "NOT SUPPORTED", "[N/A]", "UNKNOWN ERROR"}:
        return None
    return value


def _enabled(value: str | None) -> bool | None:
    if value == "Enabled":
        return True
    if value == "Disabled":
        return False
    return None


def _mib(value: str | None, where: str) -> int:
    match = re.fullmatch(r"(\d+)\s*MiB", value or "")
    if match is None:
        raise FactParseError(f"nvidia-smi -q -x: {where} is {value!r}, expected '<n> MiB'")
    return int(match.group(1))


def parse_nvidia_smi_xml(text: str) -> GpuInventory:
    """Parse ``nvidia-smi -q -x``: driver and CUDA versions, and each GPU.

    The document names an external DTD; ElementTree never fetches it. Documents that declare
    entities are refused (nvidia-smi never writes them).
    """
    if "<!ENTITY" in text:
        raise FactParseError("nvidia-smi -q -x: the document declares entities; refusing it")
    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        raise FactParseError(f"nvidia-smi -q -x: not XML ({exc})") from exc
    if root.tag != "nvidia_smi_log":
        raise FactParseError(
            f"nvidia-smi -q -x: root element is <{root.tag}>, not <nvidia_smi_log>"
        )
    driver = _text(root, "driver_version")
    if driver is None:
        raise FactParseError("nvidia-smi -q -x: no <driver_version>")
    gpus: list[Gpu] = []
    for index, elem in enumerate(root.findall("gpu")):
        where = f"GPU {index}"
        bus_id = _text(elem, "pci/pci_bus_id") or elem.get("id")
        name = _text(elem, "product_name")
        uuid = _text(elem, "uuid")
        if bus_id is None or name is None or uuid is None:
            raise FactParseError(f"nvidia-smi -q -x: {where} lacks a bus id, product name or uuid")
        minor = _known(_text(elem, "minor_number"))
        health = memory_health(elem)
        gpus.append(
            Gpu(
                index=index,
                product_name=name,
                pci_bus_id=bus_id,
                uuid=uuid,
                memory_total_mib=_mib(_text(elem, "fb_memory_usage/total"), f"{where} memory"),
                persistence_mode=_enabled(_text(elem, "persistence_mode")),
                ecc_current=_enabled(_text(elem, "ecc_mode/current_ecc")),
                architecture=_known(_text(elem, "product_architecture")),
                minor_number=int(minor) if minor is not None and minor.isdigit() else None,
                vbios_version=_known(_text(elem, "vbios_version")),
                fabric_state=_known(_text(elem, "fabric/state")),
                fabric_status=_known(_text(elem, "fabric/status")),
                uncorrectable_ecc=health.uncorrectable_ecc,
                row_remap_pending=health.remap_pending,
                row_remap_failure=health.remap_failure,
            )
        )
    attached = _text(root, "attached_gpus")
    if attached is not None and attached.isdigit() and int(attached) != len(gpus):
        raise FactParseError(
            f"nvidia-smi -q -x: attached_gpus says {attached} but {len(gpus)} <gpu> elements follow"
        )
    return GpuInventory(
        driver_version=driver, cuda_version=_known(_text(root, "cuda_version")), gpus=tuple(gpus)
    )


# ---------------------------------------------------------------- nvidia-smi topo -m

LINK_RANK: dict[str, int] = {"PIX": 0, "PXB": 1, "PHB": 2, "NODE": 3, "SYS": 4, "SOC": 4}
"""PCIe distance between a GPU and a NIC, nearest first (SOC is the old name of SYS)."""

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_NV = re.compile(r"NV(\d+)")
_AFFINITY_COLUMNS = ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID")


class TopoGpu(Fact):
    """A GPU row of the matrix with its CPU and NUMA affinity."""

    index: int
    label: str
    cpu_affinity: str | None = None
    numa_node: int | None = None
    gpu_numa_id: int | None = None


class TopoNic(Fact):
    """A NIC column of the matrix; ``name`` comes from the NIC legend (``NIC0: mlx5_0``)."""

    index: int
    label: str
    name: str


class Topology(Fact):
    """``nvidia-smi topo -m``: who is connected to whom, and how."""

    gpus: tuple[TopoGpu, ...]
    nics: tuple[TopoNic, ...]
    labels: tuple[str, ...]
    """Matrix order of the devices (``GPU0``.., then ``NIC0``..)."""
    matrix: tuple[tuple[str, ...], ...]
    """``matrix[i][j]``: link between ``labels[i]`` and ``labels[j]`` (``X`` on the diagonal)."""

    def link(self, a: str, b: str) -> str:
        """Link type between two devices named by matrix label (``GPU0``, ``NIC3``)."""
        try:
            return self.matrix[self.labels.index(a)][self.labels.index(b)]
        except ValueError:
            raise KeyError(
                f"{a} or {b} is not in the topology ({', '.join(self.labels)})"
            ) from None

    def nvlinks(self, a: int, b: int) -> int:
        """Bonded NVLinks between GPU ``a`` and GPU ``b`` (0 if they meet over PCIe only)."""
        match = _NV.fullmatch(self.link(f"GPU{a}", f"GPU{b}"))
        return int(match.group(1)) if match else 0

    def nic(self, name: str) -> TopoNic:
        """The NIC called ``name`` (``mlx5_0``) or labelled ``name`` (``NIC0``)."""
        for nic in self.nics:
            if name in (nic.name, nic.label):
                return nic
        raise KeyError(name)


def _int_or_none(token: str | None) -> int | None:
    return int(token) if token is not None and token.isdigit() else None


def parse_nvidia_smi_topo(text: str) -> Topology:
    """Parse ``nvidia-smi topo -m``: the link matrix, GPU affinities and the NIC legend.

    Works with tab- or space-separated output, with the ANSI underline nvidia-smi puts on the
    header, and with the older form that names NIC columns ``mlx5_0`` directly.
    """
    lines = [_ANSI.sub("", line).rstrip("\r") for line in text.splitlines()]
    header_at = next(
        (
            i
            for i, line in enumerate(lines)
            if (tokens := line.split())
            and tokens[0] == "GPU0"
            and ("Affinity" in tokens or (len(tokens) > 1 and tokens[1] != "X"))
        ),
        None,
    )
    if header_at is None:
        raise FactParseError("nvidia-smi topo -m: no header line starting with GPU0")
    header = lines[header_at]
    tokens = header.split()
    labels = tuple(tokens[: tokens.index("CPU")] if "CPU" in tokens else tokens)
    extras = [name for name in _AFFINITY_COLUMNS if name in " ".join(header.split())]

    rows: dict[str, list[str]] = {}
    rest: dict[str, list[str]] = {}
    for line in lines[header_at + 1 :]:
        fields = line.split()
        if not fields or fields[0] == "Legend:":
            break
        label = fields[0]
        if label not in labels:
            raise FactParseError(f"nvidia-smi topo -m: row {label!r} is not a column of the header")
        if len(fields) < 1 + len(labels):
            raise FactParseError(
                f"nvidia-smi topo -m: row {label} has {len(fields) - 1} cells for {len(labels)} "
                "columns"
            )
        rows[label] = fields[1 : 1 + len(labels)]
        rest[label] = fields[1 + len(labels) :]
    missing = [label for label in labels if label not in rows]
    if missing:
        raise FactParseError(f"nvidia-smi topo -m: no row for {', '.join(missing)}")

    legend: dict[str, str] = {}
    in_legend = False
    for line in lines:
        if line.split() == ["NIC", "Legend:"]:
            in_legend = True
            continue
        if in_legend and (match := re.fullmatch(r"\s*(NIC\d+):\s*(\S+)\s*", line)):
            legend[match.group(1)] = match.group(2)

    gpus: list[TopoGpu] = []
    nics: list[TopoNic] = []
    for label in labels:
        if (match := re.fullmatch(r"GPU(\d+)", label)) is not None:
            values = dict(zip(extras, rest[label], strict=False))
            cpu = values.get("CPU Affinity")
            gpus.append(
                TopoGpu(
                    index=int(match.group(1)),
                    label=label,
                    cpu_affinity=None if cpu in (None, "N/A") else cpu,
                    numa_node=_int_or_none(values.get("NUMA Affinity")),
                    gpu_numa_id=_int_or_none(values.get("GPU NUMA ID")),
                )
            )
        else:
            nics.append(TopoNic(index=len(nics), label=label, name=legend.get(label, label)))
    return Topology(
        gpus=tuple(gpus),
        nics=tuple(nics),
        labels=labels,
        matrix=tuple(tuple(rows[label]) for label in labels),
    )


def nearest_nics(topology: Topology, usable: Collection[str] | None = None) -> dict[int, list[str]]:
    """For each GPU index, the NIC name(s) at the shortest PCIe distance (PIX < PXB < PHB <
    NODE < SYS); ties are all returned, in NIC order. ``usable`` restricts the candidates (for
    example to the ports that are Active); a GPU with no candidate maps to an empty list.
    """
    candidates = [n for n in topology.nics if usable is None or n.name in usable]
    result: dict[int, list[str]] = {}
    for gpu in topology.gpus:
        ranked = [
            (LINK_RANK[link], nic.name)
            for nic in candidates
            if (link := topology.link(gpu.label, nic.label)) in LINK_RANK
        ]
        best = min((rank for rank, _ in ranked), default=None)
        result[gpu.index] = [name for rank, name in ranked if rank == best]
    return result


def nic_per_gpu(topology: Topology, usable: Collection[str] | None = None) -> dict[int, str]:
    """One NIC per GPU: the nearest, and among equally near ones the least used so far, so
    two GPUs behind one PCIe switch with two NICs get one NIC each. GPUs without a candidate
    are left out.
    """
    used: Counter[str] = Counter()
    chosen: dict[int, str] = {}
    for gpu_index, names in nearest_nics(topology, usable).items():
        if names:
            pick = min(names, key=lambda name: (used[name], names.index(name)))
            used[pick] += 1
            chosen[gpu_index] = pick
    return chosen


# ---------------------------------------------------------------- ibstat / ibv_devinfo


class IbPort(Fact):
    """One port of an RDMA device (HCA)."""

    ca: str
    port: int
    state: str
    """``Active``, ``Down``, ``Init``, ``Armed``: the logical state."""
    physical_state: str | None = None
    """``LinkUp``, ``Polling`` (no peer seen), ``Disabled``..."""
    rate_gbps: float | None = None
    link_layer: str | None = None
    """``InfiniBand`` or ``Ethernet`` (RoCE)."""
    ca_type: str | None = None
    firmware: str | None = None

    @property
    def active(self) -> bool:
        """Whether the port can carry traffic."""
        return self.state == "Active"

    @property
    def name(self) -> str:
        """``mlx5_0/1``: device and port, as messages show them."""
        return f"{self.ca}/{self.port}"


_KEY_VALUE = re.compile(r"^\s*([A-Za-z][A-Za-z _]*?):\s*(.*?)\s*$")


def _float(value: str | None, command: str, where: str) -> float | None:
    if value is None:
        return None
    match = re.match(r"\s*(\d+(?:\.\d+)?)", value)
    if match is None:
        raise FactParseError(f"{command}: {where} rate {value!r} is not a number")
    return float(match.group(1))


def parse_ibstat(text: str) -> tuple[IbPort, ...]:
    """Parse ``ibstat``: every port of every CA, with state, physical state, rate and link
    layer."""
    ports: list[IbPort] = []
    ca: str | None = None
    ca_fields: dict[str, str] = {}
    port_no: int | None = None
    port_fields: dict[str, str] = {}

    def flush() -> None:
        if ca is None or port_no is None:
            return
        where = f"CA {ca} port {port_no}"
        state = port_fields.get("State")
        if state is None:
            raise FactParseError(f"ibstat: {where} has no State line")
        ports.append(
            IbPort(
                ca=ca,
                port=port_no,
                state=state,
                physical_state=port_fields.get("Physical state"),
                rate_gbps=_float(port_fields.get("Rate"), "ibstat", where),
                link_layer=port_fields.get("Link layer"),
                ca_type=ca_fields.get("CA type"),
                firmware=ca_fields.get("Firmware version"),
            )
        )

    for line in text.splitlines():
        if (match := re.match(r"^CA '([^']+)'\s*$", line)) is not None:
            flush()
            ca, ca_fields, port_no, port_fields = match.group(1), {}, None, {}
            continue
        if (match := re.match(r"^\s+Port (\d+):\s*$", line)) is not None:
            if ca is None:
                raise FactParseError(f"ibstat: {line.strip()!r} before any CA line")
            flush()
            port_no, port_fields = int(match.group(1)), {}
            continue
        if (match := _KEY_VALUE.match(line)) is not None and ca is not None:
            (port_fields if port_no is not None else ca_fields)[match.group(1)] = match.group(2)
    flush()
    if not ports and text.strip():
        raise FactParseError("ibstat: no CA with a port found")
    return tuple(ports)


def _verbs_word(value: str) -> str:
    """``PORT_ACTIVE (4)`` -> ``Active``; ``LINK_UP (5)`` -> ``LinkUp``."""
    word = re.sub(r"\s*\(\d+\)\s*$", "", value).strip()
    word = word.removeprefix("PORT_")
    return "".join(part.capitalize() for part in re.split(r"[_ ]+", word) if part)


def _verbs_rate(width: str | None, speed: str | None) -> float | None:
    """``active_width 4X (2)`` x ``active_speed 25.0 Gbps (32)`` -> 100.0 Gb/s."""
    lanes = re.match(r"\s*(\d+)X", width or "")
    per_lane = re.match(r"\s*(\d+(?:\.\d+)?)\s*Gbps", speed or "")
    if lanes is None or per_lane is None:
        return None
    return int(lanes.group(1)) * float(per_lane.group(1))


def _verbs_part(part_id: str | None) -> str | None:
    """``4129`` -> ``MT4129``, the spelling ibstat uses for the same device."""
    return f"MT{part_id}" if part_id is not None and part_id.isdigit() else part_id


def parse_ibv_devinfo(text: str) -> tuple[IbPort, ...]:
    """Parse ``ibv_devinfo`` (or ``ibv_devinfo -v``): every port of every HCA. The plain form
    has no link rate (``rate_gbps`` is None); ``-v`` gives width and speed, whose product is the
    rate."""
    ports: list[IbPort] = []
    hca: str | None = None
    hca_fields: dict[str, str] = {}
    port_no: int | None = None
    port_fields: dict[str, str] = {}

    def flush() -> None:
        if hca is None or port_no is None:
            return
        state = port_fields.get("state")
        if state is None:
            raise FactParseError(f"ibv_devinfo: {hca} port {port_no} has no state line")
        phys = port_fields.get("phys_state")
        ports.append(
            IbPort(
                ca=hca,
                port=port_no,
                state=_verbs_word(state),
                physical_state=_verbs_word(phys) if phys else None,
                rate_gbps=_verbs_rate(
                    port_fields.get("active_width"), port_fields.get("active_speed")
                ),
                link_layer=port_fields.get("link_layer"),
                ca_type=_verbs_part(hca_fields.get("vendor_part_id")),
                firmware=hca_fields.get("fw_ver"),
            )
        )

    for line in text.splitlines():
        match = _KEY_VALUE.match(line)
        if match is None:
            continue
        key, value = match.group(1), match.group(2)
        if key == "hca_id":
            flush()
            hca, hca_fields, port_no, port_fields = value, {}, None, {}
        elif key == "port" and hca is not None:
            flush()
            if not value.isdigit():
                raise FactParseError(f"ibv_devinfo: {hca} port {value!r} is not a number")
            port_no, port_fields = int(value), {}
        elif hca is not None:
            (port_fields if port_no is not None else hca_fields)[key] = value
    flush()
    if not ports and text.strip():
        raise FactParseError("ibv_devinfo: no hca_id with a port found")
    return tuple(ports)


# ---------------------------------------------------------------- df


def parse_df_bytes(text: str) -> int:
    """Free bytes from ``df -B1 --output=avail DIR`` or ``df -B1 DIR`` (last data line)."""
    lines = [line for line in text.splitlines() if line.strip()]
    header_at = next(
        (i for i, line in enumerate(lines) if {"Avail", "Available"} & set(line.split())), None
    )
    if header_at is None or header_at + 1 >= len(lines):
        raise FactParseError("df: no Avail/Available column followed by a data line")
    header = lines[header_at].split()
    column = header.index("Avail") if "Avail" in header else header.index("Available")
    fields = lines[-1].split()
    value = fields[column] if column < len(fields) else ""
    if not value.isdigit():
        raise FactParseError(f"df: available space {value!r} is not a byte count (run df with -B1)")
    return int(value)


# ---------------------------------------------------------------- ss


class ListeningSocket(Fact):
    """A TCP socket in LISTEN state."""

    address: str
    port: int


def parse_listening_ports(text: str) -> tuple[ListeningSocket, ...]:
    """Parse ``ss -Hltn`` (``ss -ltn`` with its header also works): local address and port of
    each listening socket."""
    sockets: list[ListeningSocket] = []
    for line in text.splitlines():
        fields = line.split()
        if not fields or fields[0] in {"State", "Netid"}:
            continue
        if fields[0] == "tcp":  # ss -a prints the Netid column first
            fields = fields[1:]
        if len(fields) < 5 or fields[0] != "LISTEN":
            continue
        local = fields[3]
        address, sep, port = local.rpartition(":")
        if not sep or not port.isdigit():
            raise FactParseError(f"ss: local address {local!r} has no port")
        sockets.append(ListeningSocket(address=address, port=int(port)))
    return tuple(sockets)


def bound_ports(sockets: Collection[ListeningSocket]) -> frozenset[int]:
    """The port numbers something listens on."""
    return frozenset(s.port for s in sockets)


# ---------------------------------------------------------------- clock


class ClockSync(Fact):
    """Whether the system clock is synchronized, and the line that says so."""

    synchronized: bool
    source: Literal["timedatectl", "chrony"]
    detail: str


def parse_clock_sync(text: str) -> ClockSync:
    """Parse ``timedatectl show``, ``timedatectl [status]`` or ``chronyc tracking``."""
    for line in text.splitlines():
        stripped = line.strip()
        if (match := re.fullmatch(r"NTPSynchronized=(yes|no)", stripped)) is not None:
            return ClockSync(
                synchronized=match.group(1) == "yes", source="timedatectl", detail=stripped
            )
        match = re.fullmatch(r"(System clock synchronized|NTP synchronized):\s*(yes|no)", stripped)
        if match is not None:
            return ClockSync(
                synchronized=match.group(2) == "yes", source="timedatectl", detail=stripped
            )
        if (match := re.fullmatch(r"Leap status\s*:\s*(.+)", stripped)) is not None:
            status = match.group(1).strip()
            return ClockSync(
                synchronized=not status.lower().startswith("not synchroni"),
                source="chrony",
                detail=f"Leap status: {status}",
            )
    raise FactParseError(
        "clock: no NTPSynchronized=, 'System clock synchronized:' or 'Leap status' line"
    )


# ---------------------------------------------------------------- OS, kernel


class OsRelease(Fact):
    """The fields of /etc/os-release that decide package handling."""

    id: str
    version_id: str | None = None
    pretty_name: str | None = None
    id_like: tuple[str, ...] = ()
    version_codename: str | None = None


def parse_os_release(text: str) -> OsRelease:
    """Parse /etc/os-release (shell-style KEY=value lines, values possibly quoted)."""
    values: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        key, sep, raw = stripped.partition("=")
        if not sep or not re.fullmatch(r"[A-Z][A-Z0-9_]*", key):
            raise FactParseError(f"os-release: line {number} is not KEY=value: {stripped!r}")
        try:
            parts = shlex.split(raw)
        except ValueError as exc:
            raise FactParseError(f"os-release: line {number}: {exc}") from exc
        values[key] = " ".join(parts)
    if "ID" not in values:
        raise FactParseError("os-release: no ID line")
    return OsRelease(
        id=values["ID"],
        version_id=values.get("VERSION_ID"),
        pretty_name=values.get("PRETTY_NAME"),
        id_like=tuple(values.get("ID_LIKE", "").split()),
        version_codename=values.get("VERSION_CODENAME"),
    )


def parse_kernel_release(text: str) -> str:
    """Kernel release from ``uname -r`` (one word) or ``uname -a`` (third word)."""
    fields = text.split()
    if len(fields) == 1:
        return fields[0]
    if len(fields) >= 3 and fields[0] == "Linux":
        return fields[2]
    raise FactParseError(f"uname: cannot find the kernel release in {text.strip()[:80]!r}")


# ---------------------------------------------------------------- systemd unit state

ServiceState = Literal[
    "active", "reloading", "inactive", "failed", "activating", "deactivating", "maintenance"
]
_SERVICE_STATES: dict[str, ServiceState] = {state: state for state in get_args(ServiceState)}


def _service_state(word: str) -> ServiceState:
    try:
        return _SERVICE_STATES[word]
    except KeyError:
        raise FactParseError(
            f"systemctl: {word!r} is not a unit state ({', '.join(_SERVICE_STATES)})"
        ) from None


def parse_service_state(text: str) -> ServiceState:
    """Unit state from ``systemctl is-active UNIT`` (one word) or ``systemctl status UNIT``
    (its ``Active:`` line). Used for nvidia-fabricmanager."""
    for line in text.splitlines():
        if (match := re.match(r"^\s*Active:\s*(\S+)", line)) is not None:
            return _service_state(match.group(1))
    words = text.split()
    if len(words) == 1:
        return _service_state(words[0])
    raise FactParseError(
        "systemctl: expected the one word of is-active or the Active: line of status"
    )


# ---------------------------------------------------------------- one host


# ---------------------------------------------------------------- du, docker ps


def parse_du_bytes(text: str) -> int:
    """Bytes a directory holds from ``du -s -B1 DIR`` (first field of the last line); empty
    output (the directory does not exist) is 0."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return 0
    first = lines[-1].split()[0]
    if not first.isdigit():
        raise FactParseError(f"du: {first!r} is not a byte count (run du with -s -B1)")
    return int(first)


def parse_names(text: str) -> tuple[str, ...]:
    """One name per line (``docker ps --format '{{.Names}}'``); empty output is none."""
    return tuple(line.strip() for line in text.splitlines() if line.strip())


# ---------------------------------------------------------------- one host


class HostFacts(Fact):
    """Everything preflight knows about one host; None where a fact was not collected."""

    host: str
    gpus: GpuInventory | None = None
    topology: Topology | None = None
    ib_ports: tuple[IbPort, ...] | None = None
    model_dir_free_bytes: int | None = None
    model_dir_used_bytes: int | None = None
    listening: tuple[ListeningSocket, ...] | None = None
    clock: ClockSync | None = None
    os: OsRelease | None = None
    kernel: str | None = None
    fabric_manager: ServiceState | None = None
    containers: tuple[str, ...] | None = None
    xids: tuple[XidEvent, ...] | None = None
    """The NVIDIA driver's XID reports in the kernel log since the driver last loaded."""
    gpu_diag: tuple[DiagResult, ...] | None = None
    nvlink: tuple[NvLink, ...] | None = None
    """Every NVLink of every GPU and its state (none on a GPU without NVLink)."""


# ---------------------------------------------------------------- the commands behind the facts

MODEL_DIR = "{model_dir}"
"""Stands in a command's argv for the plan's model directory."""
DIAG_LEVEL = "{dcgm_diag_level}"
"""Stands in a command's argv for the DCGM diagnostic level (``dcgmi diag -r LEVEL``)."""
DIAG_LEVELS = (1, 2, 3, 4)
"""DCGM's run levels: 1 quick (deployment checks, seconds), 2 medium (about two minutes),
3 long (about half an hour), 4 extended (about an hour and a half)."""
DEFAULT_DIAG_LEVEL = 1


@dataclass(frozen=True)
class FactCommand:
    """One fact: the read-only command that shows it on a host and the parser that reads it.

    The roles run ``argv`` (``k2.cluster.fact_commands``), keep its output under ``key``
    (``k2.cluster.fact_texts``) and :func:`~k2provision.core.expectations.host_facts` parses it into
    the :class:`HostFacts` field ``field``. Several commands may fill one field: the first whose
    output parses wins (``ibv_devinfo -v`` where ``ibstat`` is missing).
    """

    key: str
    argv: tuple[str, ...]
    label: str
    """How messages name the command."""
    parse: Callable[[str], object]
    field: str
    hardware: bool = False
    """Needs GPUs or HCAs: read only on GPU hosts outside the lab profile."""
    any_exit: bool = False
    """The output is the fact whatever the exit status (``systemctl is-active``)."""
    empty_is_answer: bool = False
    """Empty output means something (no listener, no container, no directory yet)."""
    fix: str = ""
    """What to do when the command gives nothing usable, where more than running it again
    helps (empty: run it on the host and check its output)."""

    def command(self, model_dir: str, dcgm_diag_level: int = DEFAULT_DIAG_LEVEL) -> list[str]:
        """The argv to run for a plan whose weights live in ``model_dir``, running DCGM's
        diagnostic at ``dcgm_diag_level`` (one of :data:`DIAG_LEVELS`)."""
        if dcgm_diag_level not in DIAG_LEVELS:
            raise ValueError(
                f"DCGM diagnostic level {dcgm_diag_level!r}; expected one of "
                f"{', '.join(map(str, DIAG_LEVELS))}"
            )
        given = {MODEL_DIR: model_dir, DIAG_LEVEL: str(dcgm_diag_level)}
        return [given.get(arg, arg) for arg in self.argv]

    def text(self, rc: int | None, stdout: str | None) -> str | None:
        """What a run of the command leaves to parse: None when it gave nothing usable."""
        if stdout is None or (rc != 0 and not self.any_exit):
            return None
        return stdout if stdout.strip() or self.empty_is_answer else None


def _dcgm_diag(text: str) -> tuple[DiagResult, ...]:
    try:
        return parse_dcgm_diag(text)
    except ValueError as exc:
        raise FactParseError(f"dcgmi diag -j: {exc}") from exc


def _listening(text: str) -> tuple[ListeningSocket, ...]:
    return parse_listening_ports(text) if text.strip() else ()


FACT_COMMANDS: tuple[FactCommand, ...] = (
    FactCommand("nvidia_smi_xml", ("nvidia-smi", "-q", "-x"), "nvidia-smi -q -x",
                parse_nvidia_smi_xml, "gpus", hardware=True),
    FactCommand("nvidia_smi_topo", ("nvidia-smi", "topo", "-m"), "nvidia-smi topo -m",
                parse_nvidia_smi_topo, "topology", hardware=True),
    FactCommand("ibstat", ("ibstat",), "ibstat", parse_ibstat, "ib_ports", hardware=True),
    FactCommand("ibv_devinfo", ("ibv_devinfo", "-v"), "ibv_devinfo -v", parse_ibv_devinfo,
                "ib_ports", hardware=True),
    FactCommand("fabric_manager", ("systemctl", "is-active", "nvidia-fabricmanager"),
                "systemctl is-active nvidia-fabricmanager", parse_service_state,
                "fabric_manager", hardware=True, any_exit=True),
    # The model dir may not exist yet: df reads its nearest existing parent.
    FactCommand("df_avail",
                ("sh", "-c",
                 'd="$1"; while [ ! -e "$d" ]; do d=$(dirname "$d"); done; '
                 'exec df -B1 --output=avail "$d"', "df-model-dir", MODEL_DIR),
                "df -B1 --output=avail <k2_model_dir>", parse_df_bytes, "model_dir_free_bytes"),
    FactCommand("du_model_dir",
                ("sh", "-c", 'if [ -d "$1" ]; then exec du -s -B1 "$1"; fi', "du-model-dir",
                 MODEL_DIR),
                "du -s -B1 <k2_model_dir>", parse_du_bytes, "model_dir_used_bytes",
                empty_is_answer=True),
    FactCommand("ss", ("ss", "-Hltn"), "ss -Hltn", _listening, "listening",
                empty_is_answer=True),
    FactCommand("clock", ("timedatectl", "show"), "timedatectl show", parse_clock_sync, "clock"),
    FactCommand("clock_chrony", ("chronyc", "tracking"), "chronyc tracking", parse_clock_sync,
                "clock"),
    FactCommand("os_release", ("cat", "/etc/os-release"), "cat /etc/os-release",
                parse_os_release, "os"),
    FactCommand("uname", ("uname", "-r"), "uname -r", parse_kernel_release, "kernel"),
    # The kernel log since boot, only the NVIDIA driver's XID lines and its load lines: XIDs
    # count from the last load (core/gpu_health.py). grep's 1: there are none.
    FactCommand("kernel_xids",
                ("sh", "-c",
                 'journalctl -k -b -q --no-pager | grep -F -e "NVRM: Xid" -e "$1" || [ $? -eq 1 ]',
                 "kernel-xids", DRIVER_LOAD_MARK),
                f"journalctl -k -b | grep -F -e 'NVRM: Xid' -e '{DRIVER_LOAD_MARK}'",
                xids_since_driver_load, "xids", empty_is_answer=True),
    # DCGM's diagnostic at the role's level (default 1, quick: deployment checks, seconds);
    # dcgmi exits non-zero when a test fails, and the JSON says which.
    FactCommand("dcgm_diag", ("dcgmi", "diag", "-r", DIAG_LEVEL, "-j"), "dcgmi diag -r LEVEL -j",
                _dcgm_diag, "gpu_diag", hardware=True, any_exit=True, fix=DCGM_FIX),
    # Each GPU's NVLinks: a rate per trained link, `<inactive>` for one that is down.
    FactCommand("nvlink", ("nvidia-smi", "nvlink", "-s"), "nvidia-smi nvlink -s",
                parse_nvlink_status, "nvlink", hardware=True, empty_is_answer=True),
    FactCommand("containers", ("docker", "ps", "--format", "{{.Names}}"),
                "docker ps --format '{{.Names}}'", parse_names, "containers",
                empty_is_answer=True),
)  # fmt: skip
"""Every fact preflight reads, in the order the roles run them; keys are unique."""

FACTS: dict[str, FactCommand] = {fact.key: fact for fact in FACT_COMMANDS}
