"""Filters of the k2_weights role (k2.cluster.weights_*): chain order, results, the report."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from k2provision.core.catalog import MODELS
from k2provision.core.model_config import config_json
from k2provision.weights.kernel import common, events

DEFAULT_MODEL = "moonshotai/Kimi-K2-Instruct"


def weights_synthetic_config(model: str) -> dict[str, Any]:
    """A config.json of the model's own form, numbers and weight formats (Kimi-K2's for a
    model the catalog does not know), marked synthetic."""
    spec = MODELS.get(model) or MODELS[DEFAULT_MODEL]
    return {**config_json(spec), "k2provision_synthetic": True}


def weights_chain(targets: Sequence[str], addresses: Mapping[str, str], port: int) -> str:
    """HOST:PORT,... for the relay's --chain, in the given (inventory) order."""
    return ",".join(common.format_address(str(addresses[t]), int(port)) for t in targets)


def weights_targets(
    hosts: Sequence[str],
    states: Mapping[str, Mapping[str, Any]],
    exclude: str,
    verify: bool,
    seed: str,
) -> list[str]:
    """Hosts that must receive (or re-check): incomplete ones, or all with verify; the seed's
    own host first when it is one of them (its relay then reads over loopback)."""
    out = [h for h in hosts if h != exclude and (verify or not states.get(h, {}).get("complete"))]
    if seed in out:
        out.remove(seed)
        out.insert(0, seed)
    return out


def weights_last_summary(stdout: str) -> dict[str, Any]:
    """The last ``summary`` event of relay JSON-lines output ({} when there is none)."""
    return events.last_relay_summary(str(stdout))


def _names(value: Any) -> list[str]:
    return [str(v) for v in value] if isinstance(value, list) else []


def weights_host_result(
    host: str,
    part: str,
    state: Mapping[str, Any],
    wait: Mapping[str, Any] | None = None,
    seed_summary: Mapping[str, Any] | None = None,
    address: str = "",
    check: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """One host's outcome, from what the role learnt about it.

    part: "target" (its relay received), "seed" (its copy is the source, checked in place),
    "untouched" (already complete; nothing ran), "predicted" (check mode).
    """
    files = int(state.get("files", 0))
    base: dict[str, Any] = {
        "host": host,
        "part": part,
        "files": files,
        "verified": 0,
        "received": [],
        "repaired": [],
        "failed": [],
        "missing": [],
        "bytes_received": 0,
        "message": "",
    }
    if part == "predicted":
        need = list(state.get("missing", [])) + [w["name"] for w in state.get("wrong", [])]
        unverified = list(state.get("unverified", []))
        base.update(
            status="ok" if state.get("complete") else "would-change",
            verified=len(state.get("present", [])),
            missing=need,
            unverified=unverified,
            need_bytes=int(state.get("need_bytes", 0)),
            message=(
                ""
                if state.get("complete")
                else f"would receive up to {common.human(int(state.get('need_bytes', 0)))}: "
                f"{len(need)} files missing or wrong, {len(unverified)} to re-hash first"
            ),
        )
        return base
    if part == "untouched":
        base.update(status="ok", verified=len(state.get("present", [])))
        return base
    if part == "seed":
        summary = dict(check or {})
        if not summary:  # complete already: nothing was checked again
            base.update(status="ok", verified=len(state.get("present", [])))
            return base
        base.update(
            status=str(summary.get("status", "incomplete")),
            verified=int(summary.get("verified", 0)),
            failed=list(summary.get("failed", [])),
            missing=_names(summary.get("missing")),
            message=str(summary.get("message", "")),
        )
        return base
    wait = dict(wait or {})
    summary = dict(wait.get("summary") or {})
    skipped = {
        str(s.get("host")): str(s.get("reason", ""))
        for s in (seed_summary or {}).get("skipped_hosts", [])
        if isinstance(s, dict)
    }
    if wait.get("lost"):
        base.update(status="lost", message=str(wait.get("message", "")))
    elif not summary:
        base.update(status=str(wait.get("status") or "lost"), message=str(wait.get("message", "")))
    else:
        base.update(
            status=str(summary.get("status", "incomplete")),
            verified=int(summary.get("verified", 0)),
            files=int(summary.get("files", files)),
            received=_names(summary.get("received")),
            repaired=_names(summary.get("repaired")),
            failed=list(summary.get("failed", [])),
            missing=_names(summary.get("missing")),
            bytes_received=int(summary.get("bytes_written", 0)),
            bytes_on_wire=int(summary.get("bytes_received", 0)),
            resumed=[r for r in summary.get("resumed", []) if isinstance(r, dict)],
            message=str(summary.get("message", "")),
        )
    if base["status"] != "ok" and address in skipped:
        base["message"] = f"skipped by the chain: {skipped[address]}; {base['message']}".rstrip(
            "; "
        )
    return base


def weights_failure(result: Mapping[str, Any]) -> str:
    """One line for a host whose copy is not verified: host, what is wrong, the fix."""
    host = result.get("host", "?")
    failed = [f"{f.get('name')} ({f.get('reason')})" for f in result.get("failed", [])]
    parts = [f"{host}: weights not verified ({result.get('status')})"]
    if result.get("message"):
        parts.append(str(result["message"]))
    if failed:
        parts.append("failed: " + ", ".join(failed[:5]) + (" ..." if len(failed) > 5 else ""))
    missing = result.get("missing") or []
    if missing:
        parts.append(f"{len(missing)} of {result.get('files')} files missing")
    parts.append(
        "fix: bring the host back (or free its disk) and re-run the weights phase; "
        "only what is missing or wrong moves again"
    )
    return "; ".join(parts)


def weights_report(results: Sequence[Mapping[str, Any]]) -> list[str]:
    """The hosts x verified files table as lines (for plain ansible-playbook output)."""
    lines = [f"{'host':<20} {'status':<13} {'verified':>9} {'received':>9} {'repaired':>9}"]
    for r in results:
        lines.append(
            f"{r.get('host')!s:<20} {r.get('status')!s:<13} "
            f"{str(r.get('verified')) + '/' + str(r.get('files')):>9} "
            f"{len(r.get('received') or []):>9} {len(r.get('repaired') or []):>9}"
            + (f"  {r['message']}" if r.get("message") else "")
        )
    return lines


class FilterModule:
    """k2.cluster.weights_* filters."""

    def filters(self) -> dict[str, Any]:
        return {
            "weights_synthetic_config": weights_synthetic_config,
            "weights_chain": weights_chain,
            "weights_targets": weights_targets,
            "weights_last_summary": weights_last_summary,
            "weights_host_result": weights_host_result,
            "weights_failure": weights_failure,
            "weights_report": weights_report,
        }
