"""The relay's output: one JSON object per line, each with ``event`` and ``host``."""

from __future__ import annotations

import json
from typing import Any


def parse_events(text: str) -> list[dict[str, Any]]:
    """The JSON-lines events in a relay's output (other lines and broken JSON skipped)."""
    events: list[dict[str, Any]] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line.startswith("{"):
            continue
        try:
            data = json.loads(line)
        except ValueError:
            continue
        if isinstance(data, dict) and "event" in data:
            events.append(data)
    return events


def last_relay_summary(text: str) -> dict[str, Any]:
    """The last ``summary`` event of a relay's output ({} when there is none)."""
    summaries = [e for e in parse_events(text) if e.get("event") == "summary"]
    return dict(summaries[-1]) if summaries else {}
