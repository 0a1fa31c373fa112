"""The DCGM fields the DCGM exporter exports: exactly those the alert rules and dashboards read.

Pure. dcgm-exporter exports the fields of the counters CSV it is started with (`-f FILE`;
one `DCGM field, Prometheus type, help` row a field, `#` comments), named as the field. Its
default file leaves out the ECC and NVLink error counters the alerts need, so the monitoring
role gives it this one. Field names are DCGM 3.3's (dcgm_fields.h).
"""

from __future__ import annotations

from typing import Literal

CounterType = Literal["gauge", "counter"]

DCGM_COUNTERS: tuple[tuple[str, CounterType, str], ...] = (
    ("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered."),
    ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "counter", "Volatile double-bit (uncorrectable) ECC errors."),
    ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "counter",
     "Rows remapped for uncorrectable errors."),
    ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "Whether remapping of rows has failed."),
    ("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", "counter",
     "NVLink recovery errors, all links."),
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %)."),
    ("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C)."),
    ("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB)."),
)  # fmt: skip
"""(DCGM field, Prometheus type, help) for every field the rules and dashboards use."""

DCGM_COUNTERS_PATH = "/etc/dcgm-exporter/k2-counters.csv"
"""Where the exporter's container reads the file (the role mounts it there)."""


def dcgm_counters_csv() -> str:
    """The counters file in dcgm-exporter's format."""
    rows = [
        "# The DCGM fields k2provision's alert rules and dashboards read (rendered, do not edit).",
        "# Format: DCGM FI field ID, Prometheus metric type, help message",
    ]
    rows += [f"{field}, {kind}, {help_text}" for field, kind, help_text in DCGM_COUNTERS]
    return "\n".join(rows) + "\n"
