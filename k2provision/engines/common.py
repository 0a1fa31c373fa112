"""Small pieces every engine renderer shares."""

from __future__ import annotations

from k2provision.models import HealthGate

TOOL_PARSER = "kimi_k2"


def http_gate(address: str, port: int, path: str, timeout_s: int) -> HealthGate:
    """A health gate on an HTTP endpoint of a host."""
    return HealthGate(url=f"http://{address}:{port}{path}", timeout_s=timeout_s)


def tool_parser(engine: str) -> str | None:
    """The tool-call parser name an engine takes for Kimi-K2 (None: the engine has no flag)."""
    return None if engine == "ktransformers" else TOOL_PARSER
