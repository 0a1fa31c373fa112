"""Why a wave of a fleet's rolling change failed, from what its tasks answered. Pure.

The rollout (roles/k2_rollout) starts a wave's new containers, waits for their health gates
(action k2.cluster.launch_gate) and smoke-tests each new instance on its own URL; these
functions turn those answers into the one reason the run fails with (empty: nothing failed).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["smoke_reason", "start_reason"]


def _last_line(text: Any) -> str:
    lines = [line for line in str(text or "").splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""


def start_reason(
    host: str,
    run: Mapping[str, Any],
    gate: Mapping[str, Any],
    execs: Mapping[str, Any] | None = None,
) -> str:
    """What failed on `host` when its new containers started: a `docker run` that failed
    (`run`, the registered loop result), a `docker exec` of a process started inside one
    (`execs`, likewise), else the health gate's failure (`gate`, the registered
    k2.cluster.launch_gate result); "" when none did (or all were skipped)."""
    for command, results in (("run", run), ("exec", execs or {})):
        for result in results.get("results") or ():
            if result.get("skipped") or result.get("rc", 0) == 0:
                continue
            item = result.get("item") or {}
            what = item.get("container", "?") if command == "run" else item.get("name", "?")
            why = _last_line(result.get("stderr")) or f"exit status {result.get('rc')}"
            return f"{host}: docker {command} {what} failed: {why}"
    failure = gate.get("k2_failure")
    if isinstance(failure, Mapping):
        return str(failure.get("summary") or f"{host}: a health gate failed")
    return ""


def smoke_reason(result: Mapping[str, Any]) -> str:
    """A smoke test sent to one instance that was not answered 200 (a `uri` loop result)."""
    url = str(result.get("item") or result.get("url") or "?")
    status = result.get("status", -1)
    answered = f"HTTP {status}" if isinstance(status, int) and status > 0 else "nothing"
    detail = _last_line(result.get("msg")) if answered == "nothing" else ""
    return f"smoke test {url}/v1/chat/completions answered {answered}" + (
        f" ({detail})" if detail else ""
    )
