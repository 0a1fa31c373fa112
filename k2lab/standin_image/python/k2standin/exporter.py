"""Stand-ins for the node exporter and NVIDIA's DCGM exporter on lab hosts (no GPUs there):
`python3 -m k2standin.exporter node|dcgm PORT` serves /metrics in the exporters' own names
(tests/fixtures/monitoring/exporter-metrics.txt lists them with their sources).

K2_LAB_XID=N makes the DCGM stand-in report XID N on GPU 0, as dcgm-exporter reports the
last XID a GPU raised (DCGM_FI_DEV_XID_ERRORS): the lab's fault for the fatal-XID alert.
"""

from __future__ import annotations

import os
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

GPUS = 8


def node_text() -> str:
    lines = [
        "# TYPE node_filesystem_avail_bytes gauge",
        'node_filesystem_avail_bytes{device="/dev/root",fstype="ext4",mountpoint="/"} 5e11',
        "# TYPE node_filesystem_size_bytes gauge",
        'node_filesystem_size_bytes{device="/dev/root",fstype="ext4",mountpoint="/"} 1e12',
        "# TYPE node_infiniband_state_id gauge",
        'node_infiniband_state_id{device="mlx5_0",port="1"} 4',
        "# TYPE node_infiniband_physical_state_id gauge",
        'node_infiniband_physical_state_id{device="mlx5_0",port="1"} 5',
    ]
    return "\n".join(lines) + "\n"


def dcgm_text() -> str:
    xid = int(os.environ.get("K2_LAB_XID", "0") or 0)
    fields = (
        ("DCGM_FI_DEV_XID_ERRORS", "gauge", lambda g: xid if g == 0 else 0),
        ("DCGM_FI_DEV_GPU_UTIL", "gauge", lambda g: 0),
        ("DCGM_FI_DEV_GPU_TEMP", "gauge", lambda g: 35),
        ("DCGM_FI_DEV_FB_USED", "gauge", lambda g: 0),
        ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "counter", lambda g: 0),
        ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "counter", lambda g: 0),
        ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", lambda g: 0),
        ("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", "counter", lambda g: 0),
    )
    lines = []
    for name, kind, value in fields:
        lines.append(f"# TYPE {name} {kind}")
        lines.extend(f'{name}{{gpu="{g}",modelName="stand-in"}} {value(g)}' for g in range(GPUS))
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("node", "dcgm") or not argv[1].isdigit():
        print("usage: python3 -m k2standin.exporter node|dcgm PORT", file=sys.stderr)
        return 2
    render = node_text if argv[0] == "node" else dcgm_text

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = render().encode() if self.path == "/metrics" else b""
            self.send_response(200 if body else 404)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    ThreadingHTTPServer(("0.0.0.0", int(argv[1])), Handler).serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
