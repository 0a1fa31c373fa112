"""The fit's own error, derived from its calibration against published engine figures.

Every calibration point (engines/vllm.py CALIBRATION; docs/fit.md "Calibration") is a KV
capacity an engine logged next to the capacity the fit predicts at the same settings. The
largest difference, in GiB of KV cache per GPU, is how far the fit is known to miss: a plan
whose KV headroom per GPU is smaller than that may not hold one request of its context on
the real engine (plan/fit.py `edge_warnings`).
"""

from __future__ import annotations

import functools
import math

from k2provision.core.catalog import GIB
from k2provision.engines.memory import kv_bytes_per_token
from k2provision.engines.vllm import CALIBRATION


def calibration_errors_gib() -> dict[str, float]:
    """Per calibration point: |published - predicted| KV cache in GiB per GPU."""
    return {
        point.name: abs(point.published - point.predicted())
        / point.fit.parallel.dcp
        * kv_bytes_per_token(point.fit)
        / GIB
        for point in CALIBRATION
    }


@functools.cache
def fit_error_gib() -> float:
    """The largest calibration error, rounded up to 0.1 GiB."""
    return math.ceil(max(calibration_errors_gib().values()) * 10) / 10
