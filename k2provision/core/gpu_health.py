"""GPU health from what a host reports: kernel-log XID lines, `nvidia-smi -q -x`, `dcgmi diag -j`,
`nvidia-smi nvlink -s`.

Pure parsers and the verdicts drawn from them; collecting the outputs is the edge's job.

Which XIDs are fatal follows NVIDIA's XID catalogue ("XID Errors", NVIDIA GPU deployment and
management documentation, https://docs.nvidia.com/deploy/xid-errors/index.html): those whose
listed action is a GPU reset, a node reboot or a hardware inspection, as opposed to the ones
an application causes (13, 31, 43, 45: the application's own fault, the GPU is fine).
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
    status: str
    info: str

    @property
    def failed(self) -> bool:
        return self.status.lower() == "fail"


def parse_dcgm_diag(json_text: str) -> tuple[DiagResult, ...]:
    """Each test's result per GPU from `dcgmi diag -r LEVEL -j` (DCGM's JsonOutput layout:
    "DCGM GPU Diagnostic" -> test_categories -> tests -> results, one result per GPU with
    `gpu_ids`, `status` PASS/FAIL/WARN/SKIPPED and optional `warnings`/`info`). dcgmi prints a
    line before the document; everything before the first `{` is dropped."""
    start = json_text.find("{")
    if start < 0:
        raise ValueError("dcgmi diag printed no JSON document")
    doc = json.loads(json_text[start:])
    out = []
    for category in doc.get("DCGM GPU Diagnostic", {}).get("test_categories", []):
        for test in category.get("tests", []):
            for result in test.get("results", []):
                notes = result.get("warnings") or result.get("info") or ""
                if isinstance(notes, list):
                    notes = "; ".join(
                        str(w.get("warning", w)) if isinstance(w, dict) else str(w) for w in notes
                    )
                out.append(
                    DiagResult(
                        str(test.get("name", "?")),
                        str(result.get("gpu_ids", result.get("gpu_id", "all"))),
                        str(result.get("status", "?")),
                        str(notes),
                    )
                )
    return tuple(out)


# `GPU 3: NVIDIA H100 80GB HBM3 (UUID: GPU-...)` then one `\t Link N: 26.562 GB/s` line per link;
# a link that is down reads `Link N: <inactive>`.
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
(`GPU 1: ... NVML: Unable to retrieve NVLink information as all links are inActive`)."""


def parse_nvlink_status(text: str) -> tuple[NvLink, ...]:
    """Every link of every GPU in `nvidia-smi nvlink -s` (a GPU without NVLink lists none)."""
    links = []
    gpu: int | None = None
    for line in text.splitlines():
        head = _NVLINK_GPU.match(line)
        if head:
            gpu = int(head["gpu"])
            if "all links are inactive" in line.lower():
                links.append(NvLink(gpu, NO_LINK, line[line.index("NVML") :].strip()))
            continue
        link = _NVLINK_LINK.match(line)
        if link and gpu is not None:
            links.append(NvLink(gpu, int(link["link"]), link["state"]))
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
    """Every reason `host`'s GPUs should not serve: fatal XIDs since boot, uncorrectable ECC,
    pending or failed row remaps, failed DCGM diagnostics, NVLinks down."""
    problems = [str(e) for e in parse_xids(kernel_log) if e.fatal]
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
