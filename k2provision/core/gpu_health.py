"""GPU health from what a host reports: kernel-log XID lines, `nvidia-smi -q -x`, `dcgmi diag -j`,
`nvidia-smi nvlink -s`.

Pure parsers and the verdicts drawn from them; collecting the outputs is the edge's job.

Which XIDs are fatal follows NVIDIA's XID catalogue ("XID Errors", NVIDIA GPU deployment and
management documentation, https://docs.nvidia.com/deploy/xid-errors/index.html): those whose
listed action is a GPU reset, a node reboot or a hardware inspection, as opposed to the ones
an application causes (13, 31, 43, 45: the application's own fault, the GPU is fine).

XIDs count from the NVIDIA driver's last load: the kernel module prints
`NVRM: loading NVIDIA UNIX ...` each time it loads (`nv_printf(NV_DBG_ERRORS, "NVRM: loading %s",
pNVRM_ID)` in the module init of NVIDIA's open-gpu-kernel-modules, kernel-open/nvidia/nv.c), so a
driver reload or a reboot clears an XID and a GPU reset (`nvidia-smi -r`) alone does not: the
kernel log records no line for a reset.
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass

FATAL_XIDS: dict[int, str] = {
    48: "double-bit ECC error",
    61: "internal micro-controller breakpoint/warning",
    62: "internal micro-controller halt",
    64: "ECC page retirement or row remapping failure",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    94: "contained ECC error",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
    140: "unrecovered ECC error",
}
"""XID -> what NVIDIA's catalogue calls it, for the XIDs that take the GPU out of service."""

# `NVRM: Xid (PCI:0000:18:00): 79, pid=..., GPU has fallen off the bus.` (dmesg / journalctl -k)
_XID_LINE = re.compile(r"NVRM: Xid \((?:PCI:)?(?P<pci>[0-9A-Fa-f:.]+)\): (?P<xid>\d+),(?P<rest>.*)")
DRIVER_LOAD_MARK = "NVRM: loading NVIDIA UNIX"
"""What the kernel log says each time the NVIDIA driver loads (the collection greps for it):
`NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  580.82.09  Release Build ...` (open
module) or `NVRM: loading NVIDIA UNIX x86_64 Kernel Module  580.82.09  ...` (proprietary)."""


@dataclass(frozen=True)
class XidEvent:
    pci: str
    xid: int
    text: str

    @property
    def fatal(self) -> bool:
        return self.xid in FATAL_XIDS

    def __str__(self) -> str:
        what = FATAL_XIDS.get(self.xid, "not fatal")
        return f"XID {self.xid} on GPU {self.pci} ({what}): {self.text.strip()}"


def parse_xids(kernel_log: str) -> tuple[XidEvent, ...]:
    """Every XID line of a kernel log, in order."""
    found = []
    for line in kernel_log.splitlines():
        m = _XID_LINE.search(line)
        if m:
            found.append(XidEvent(m["pci"].lower(), int(m["xid"]), m["rest"]))
    return tuple(found)


def xids_since_driver_load(kernel_log: str) -> tuple[XidEvent, ...]:
    """The XID lines after the driver's last `NVRM: loading` line (every XID line when the log
    has none: it starts after the load, or the driver never reloaded since the log began)."""
    lines = kernel_log.splitlines()
    loads = [i for i, line in enumerate(lines) if DRIVER_LOAD_MARK in line]
    return parse_xids("\n".join(lines[loads[-1] + 1 :] if loads else lines))


@dataclass(frozen=True)
class GpuMemoryHealth:
    """One GPU's memory health from `nvidia-smi -q -x`."""

    pci: str
    uncorrectable_ecc: int
    """Volatile (since the driver loaded) uncorrectable ECC errors, all memories."""
    remap_pending: bool
    remap_failure: bool

    def problems(self) -> list[str]:
        out = []
        if self.uncorrectable_ecc:
            out.append(
                f"{self.uncorrectable_ecc} uncorrectable ECC error(s) since the driver loaded"
            )
        if self.remap_pending:
            out.append("a row remap is pending (takes effect at the next GPU reset)")
        if self.remap_failure:
            out.append("a row remap failed (the GPU has run out of spare rows)")
        return out


def _int(text: str | None) -> int:
    try:
        return int((text or "").strip())
    except ValueError:  # "N/A" where the GPU has no such counter
        return 0


def memory_health(gpu: ET.Element) -> GpuMemoryHealth:
    """One `<gpu>` element's ECC and row-remap state."""
    volatile = gpu.find("ecc_errors/volatile")
    dbe = 0
    for node in volatile if volatile is not None else ():
        if node.tag == "double_bit":  # older drivers: per memory, then a total
            dbe += _int(node.findtext("total"))
        elif "uncorrectable" in node.tag:  # Hopper: dram_uncorrectable, sram_uncorrectable_*
            dbe += _int(node.text)
    remap = gpu.find("remapped_rows")
    pending = failure = False
    if remap is not None:
        pending = (remap.findtext("remapped_row_pending") or "").strip().lower() == "yes"
        failure = (remap.findtext("remapped_row_failure") or "").strip().lower() == "yes"
    return GpuMemoryHealth(gpu.get("id", "?").lower(), dbe, pending, failure)


def parse_memory_health(xml_text: str) -> tuple[GpuMemoryHealth, ...]:
    """Each GPU's ECC and row-remap state from `nvidia-smi -q -x`."""
    return tuple(memory_health(gpu) for gpu in ET.fromstring(xml_text).iter("gpu"))


@dataclass(frozen=True)
class DiagResult:
    test: str
    gpu: str
    """The GPU(s) the result is for ("1", "0,1"), or the entity DCGM 4 names ("CPU 0"), or
    "all" for a test's overall result."""
    status: str
    info: str

    @property
    def failed(self) -> bool:
        return self.status.lower() == "fail"


DCGM3_ROOT = "DCGM GPU Diagnostic"
DCGM4_ROOT = "DCGM Diagnostic"
"""The root keys of `dcgmi diag -j`: NVVS_NAME in DCGM's nvvs/include/NvvsJsonStrings.h was
"DCGM GPU Diagnostic" up to 3.3.9 and is "DCGM Diagnostic" from 4.0.0 on."""


DCGM_FIX = (
    "install DCGM 4 from NVIDIA's CUDA apt repository (`apt install "
    "datacenter-gpu-manager-4-cuda13` for a 580 driver, whose CUDA is 13; -cuda12 for a 570 "
    "driver), start its host engine (`systemctl enable --now nvidia-dcgm`) and check that "
    "`dcgmi diag -r 1 -j` prints results"
)
"""What the GPU health gate needs on a GPU host: `dcgmi` and the host engine it talks to
(nv-hostengine, run by the nvidia-dcgm unit of DCGM's config-files/systemd/nvidia-dcgm.service.in;
packages datacenter-gpu-manager-4-cuda12/-cuda13 of its cmake/packaging.cmake). The gate reads
`dcgmi diag -j` of DCGM 3.x too (parse_dcgm_diag)."""


def _notes(result: dict[str, object]) -> str:
    """A result's warnings (objects with `warning`; 3.x level-one entries name it `warnings`)
    and info (a string in 3.x, a list of strings in 4.x), joined."""
    parts: list[str] = []
    for key in ("warnings", "info"):
        value = result.get(key)
        for item in value if isinstance(value, list) else [value] if value else []:
            text = (
                item.get("warning", item.get("warnings", item)) if isinstance(item, dict) else item
            )
            parts.append(str(text))
    return "; ".join(parts)


def _entity(result: dict[str, object]) -> str:
    """Which GPU (or other entity) a result is for: 3.x `gpu_ids`/`gpu_id`, 4.x
    `entity_group` + `entity_id` (a GPU by its id alone, as 3.x named it)."""
    if "entity_id" in result:
        group = str(result.get("entity_group", "GPU"))
        return str(result["entity_id"]) if group == "GPU" else f"{group} {result['entity_id']}"
    return str(result.get("gpu_ids", result.get("gpu_id", "all")))


def parse_dcgm_diag(json_text: str) -> tuple[DiagResult, ...]:
    """Each test's result per GPU from `dcgmi diag -r LEVEL -j`, in either layout DCGM writes.

    DCGM 3.x (dcgmi/Diag.cpp up to v3.3.9): `"DCGM GPU Diagnostic"` -> `test_categories` ->
    `tests` -> `results`, one result per GPU with `gpu_id` (or `gpu_ids`), `status` and
    optional `warnings`/`info`. DCGM 4.x (dcgmi/Diag.cpp HelperJsonBuildOutput, v4.0.0 on; its
    schema testing/python3/dcgm_diag_schema.json): `"DCGM Diagnostic"` -> `test_categories` ->
    `tests` -> `results` with `entity_group`, `entity_id`, `status`, and per test a
    `test_summary` whose `status` is the test's overall result (a failure DCGM ties to no
    entity shows only there). Status is Pass, Fail, Skip (4.x prints Warn as Fail).

    dcgmi prints a line before the document; everything before the first `{` is dropped.
    ValueError when there is no result to judge (no JSON, neither root key, a
    `runtime_error`, no test): a diagnostic that reported nothing has not passed."""
    start = json_text.find("{")
    if start < 0:
        said = json_text.strip().splitlines()[:1]
        raise ValueError(f"dcgmi diag printed no JSON document{f' ({said[0]!r})' if said else ''}")
    doc = json.loads(json_text[start:])
    root = doc.get(DCGM4_ROOT, doc.get(DCGM3_ROOT)) if isinstance(doc, dict) else None
    if not isinstance(root, dict):
        keys = ", ".join(map(repr, doc)) if isinstance(doc, dict) else type(doc).__name__
        raise ValueError(
            f"dcgmi diag -j has neither {DCGM4_ROOT!r} (DCGM 4) nor {DCGM3_ROOT!r} (DCGM 3) "
            f"at its root ({keys or 'empty'})"
        )
    if root.get("runtime_error"):
        raise ValueError(f"dcgmi diag did not run: {root['runtime_error']}")
    out = []
    for category in root.get("test_categories", []):
        for test in category.get("tests", []):
            name = str(test.get("name", "?"))
            results = [
                DiagResult(name, _entity(r), str(r.get("status", "?")), _notes(r))
                for r in test.get("results", [])
            ]
            summary = test.get("test_summary")
            if (
                isinstance(summary, dict)
                and str(summary.get("status", "")).lower() == "fail"
                and not any(r.failed for r in results)
            ):
                results.append(DiagResult(name, "all", "Fail", _notes(summary)))
            out.extend(results)
    if not out:
        raise ValueError("dcgmi diag -j lists no test result (no test ran)")
    return tuple(out)


# `GPU 3: NVIDIA H100 80GB HBM3 (UUID: GPU-...)` then one `\t Link N: 26.562 GB/s` line per link;
# a link that is down reads `Link N: <inactive>`. A GPU none of whose links is active gets
# `NVML: Unable to retrieve NVLink information as all links are inActive` instead of its links,
# at the end of the header line or on the line after it (leptonai/gpud issue #1085 shows the
# second form from a B200 host: `GPU 2: NVIDIA B200 (UUID: GPU-xxx)` then that NVML line).
_NVLINK_GPU = re.compile(r"^GPU (?P<gpu>\d+): ")
_NVLINK_LINK = re.compile(r"^\s*Link (?P<link>\d+): (?P<state>.*?)\s*$")
_NVLINK_RATE = re.compile(r"^\d+(?:\.\d+)? GB/s$")


@dataclass(frozen=True)
class NvLink:
    """One NVLink of one GPU from `nvidia-smi nvlink -s`."""

    gpu: int
    link: int
    state: str
    """What nvidia-smi printed: the link's rate ("26.562 GB/s") or why it has none."""

    @property
    def up(self) -> bool:
        """Only a rate is evidence of a working link (`<inactive>` and anything else is not)."""
        return bool(_NVLINK_RATE.match(self.state))

    def __str__(self) -> str:
        if self.link == NO_LINK:
            return f"GPU {self.gpu} has no active NVLink (nvidia-smi nvlink -s: {self.state})"
        return f"GPU {self.gpu} NVLink {self.link} is down (nvidia-smi nvlink -s: {self.state})"


NO_LINK = -1
"""The link number of a GPU whose links nvidia-smi could not list because none is active
(`NVML: Unable to retrieve NVLink information as all links are inActive`, on the GPU's header
line or the next)."""
_ALL_INACTIVE = "all links are inactive"


def parse_nvlink_status(text: str) -> tuple[NvLink, ...]:
    """Every link of every GPU in `nvidia-smi nvlink -s` (a GPU without NVLink lists none)."""
    links: list[NvLink] = []
    gpu: int | None = None
    for line in text.splitlines():
        head = _NVLINK_GPU.match(line)
        if head:
            gpu = int(head["gpu"])
        link = _NVLINK_LINK.match(line)
        if link and gpu is not None:
            links.append(NvLink(gpu, int(link["link"]), link["state"]))
        elif gpu is not None and _ALL_INACTIVE in line.lower():
            said = line[line.index("NVML") :] if "NVML" in line else line
            links.append(NvLink(gpu, NO_LINK, said.strip()))
    return tuple(links)


def down_links(links: tuple[NvLink, ...]) -> tuple[NvLink, ...]:
    """The links that are down. A GPU without any active link counts only where nvidia-smi
    lists several GPUs: a lone GPU (a one-GPU VM, a PCIe card) has no NVLink to lose."""
    several = len({link.gpu for link in links}) > 1
    return tuple(link for link in links if not link.up and (link.link != NO_LINK or several))


@dataclass(frozen=True)
class HostGpuHealth:
    """The verdict on one GPU host: every problem found, each naming the GPU."""

    host: str
    problems: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.problems


def host_gpu_health(
    host: str,
    *,
    kernel_log: str = "",
    smi_xml: str | None = None,
    diag_json: str | None = None,
    nvlink_status: str | None = None,
) -> HostGpuHealth:
    """Every reason `host`'s GPUs should not serve: fatal XIDs since the driver last loaded,
    uncorrectable ECC, pending or failed row remaps, failed DCGM diagnostics, NVLinks down."""
    problems = [str(e) for e in xids_since_driver_load(kernel_log) if e.fatal]
    if smi_xml is not None:
        for gpu in parse_memory_health(smi_xml):
            problems.extend(f"GPU {gpu.pci}: {p}" for p in gpu.problems())
    if diag_json is not None:
        for r in parse_dcgm_diag(diag_json):
            if r.failed:
                problems.append(f"DCGM diag {r.test} failed on GPU {r.gpu}: {r.info}".rstrip(": "))
    if nvlink_status is not None:
        problems.extend(str(link) for link in down_links(parse_nvlink_status(nvlink_status)))
    return HostGpuHealth(host, tuple(problems))
