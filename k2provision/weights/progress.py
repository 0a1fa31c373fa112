"""The weights phase's live view and results table (the command is commands/weights.py).

The view is drawn from the JSON-lines progress file the k2_weights role appends the relays'
progress to: bytes, rate, ETA, and every host's lag behind the head of the chain. The table
shows hosts x verified files from the role's record (``weights.json``). Host names, statuses
and messages are data: they are printed as plain text, never as markup.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from rich.console import Group
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.spinner import Spinner
from rich.table import Table
from rich.text import Text

from k2provision.run.display import console, failure_line
from k2provision.run.events import Event, HostResult, TaskStarted
from k2provision.weights.kernel import common


@dataclass
class HostProgress:
    """The latest the progress file says about one relay."""

    name: str
    rx: int = 0
    total: int = 0
    rate: float = 0.0
    status: str = "waiting"
    updated: float = 0.0


class ProgressFeed:
    """Reads the role's progress file as it grows (from a thread) into per-host state."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.hosts: dict[str, HostProgress] = {}
        self.lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="weights-progress", daemon=True)
        self._buffer = ""
        self._handle: IO[str] | None = None

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.poll_once()
        if self._handle is not None:
            self._handle.close()

    def _run(self) -> None:
        while not self._stop.wait(0.25):
            self.poll_once()

    def poll_once(self) -> None:
        if self._handle is None:
            try:
                self._handle = self.path.open(encoding="utf-8")
            except OSError:
                return
        chunk = self._handle.read()
        if not chunk:
            return
        self._buffer += chunk
        *lines, self._buffer = self._buffer.split("\n")
        for line in lines:
            self.feed(line)

    def feed(self, line: str) -> None:
        """Fold one progress line into the state."""
        try:
            data = json.loads(line)
        except ValueError:
            return
        if not isinstance(data, dict) or not data.get("host"):
            return
        name = str(data["host"])
        with self.lock:
            host = self.hosts.setdefault(name, HostProgress(name))
            host.updated = time.monotonic()
            event = data.get("event")
            if event == "progress":
                host.rx = int(data.get("rx") or data.get("tx") or 0)
                host.total = int(data.get("total") or 0)
                host.rate = float(data.get("rate") or 0.0)
                host.status = "receiving" if name != "seed" else "sending"
            elif event == "summary":
                host.status = str(data.get("status", "done"))
                host.rate = 0.0
                if host.status == "ok":
                    host.rx = max(host.rx, host.total)
            elif event in ("lost", "exited", "timeout"):
                host.status = str(event)
                host.rate = 0.0

    def snapshot(self) -> list[HostProgress]:
        with self.lock:
            return [HostProgress(**vars(h)) for h in self.hosts.values()]


def progress_view(hosts: list[HostProgress], task: str) -> Group:
    """The live picture: the chain's tail against the stream, rate, ETA, each host's lag."""
    receivers = [h for h in hosts if h.name != "seed"]
    spinner = Spinner("dots", text=Text(task or "starting"))
    if not receivers:
        return Group(spinner)
    total = max(h.total for h in receivers)
    active = [h for h in receivers if h.status not in ("lost", "exited", "timeout")]
    head = max((h.rx for h in active), default=0)
    tail = min((h.rx for h in active), default=0)
    rate = max((h.rate for h in active), default=0.0)
    eta = (total - tail) / rate if rate > 0 and total > tail else 0.0
    summary = Table.grid(padding=(0, 2))
    summary.add_row(
        ProgressBar(total=max(total, 1), completed=tail, width=40),
        f"{common.human(tail)} / {common.human(total)}",
        f"{common.human(rate)}/s",
        f"ETA {int(eta) // 60}:{int(eta) % 60:02d}" if eta else "",
    )
    table = Table(show_edge=False, pad_edge=False, box=None)
    for column in ("host", "", "received", "rate", "lag", "state"):
        table.add_column(column)
    for h in receivers:
        table.add_row(
            h.name,
            ProgressBar(total=max(h.total, 1), completed=h.rx, width=24),
            f"{common.human(h.rx)} / {common.human(h.total)}",
            f"{common.human(h.rate)}/s",
            common.human(max(0, head - h.rx)),
            h.status,
        )
    return Group(spinner, summary, table)


class WeightsView:
    """Live view while the playbook runs: the current task, the broadcast's progress."""

    def __init__(self, progress_file: Path) -> None:
        self.feed = ProgressFeed(progress_file)
        self.task = ""
        self.failures: list[str] = []
        self.live = Live(
            self._render(), console=console, refresh_per_second=4, transient=True,
            get_renderable=self._render,
        )  # fmt: skip

    def _render(self) -> Group:
        return progress_view(self.feed.snapshot(), self.task)

    def __enter__(self) -> WeightsView:
        self.feed.start()
        self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.feed.stop()
        self.live.__exit__(None, None, None)

    def on_event(self, event: Event) -> None:
        """Fold one typed runner event into the view."""
        if isinstance(event, TaskStarted):
            self.task = event.name
        elif (
            isinstance(event, HostResult)
            and event.status in {"failed", "unreachable"}
            and not event.ignored
        ):
            self.failures.append(f"{event.status} {event.host}: {event.task}: {event.message}")
            console.print(failure_line(event), soft_wrap=True)


def results_table(record: dict[str, Any]) -> Table:
    """Hosts x verified files, from the role's record (weights.json)."""
    check = bool(record.get("check_mode"))
    manifest = record.get("manifest") or {}
    files = manifest.get("files") or []
    title = (
        f"weights {manifest.get('model', '')}@{str(manifest.get('revision', ''))[:12]}: "
        f"{len(files)} files, {common.human(sum(int(f.get('size', 0)) for f in files))}"
        + (" (check mode: predicted)" if check else "")
    )
    table = Table(title=title, title_justify="left")
    columns = ["host", "status", "verified"]
    columns += ["would receive"] if check else ["received", "repaired", "bytes written"]
    columns.append("detail")
    for column in columns:
        table.add_column(column)
    for h in record.get("hosts") or []:
        status = str(h.get("status", ""))
        color = "green" if status == "ok" else "yellow" if status == "would-change" else "red"
        row: list[str | Text] = [
            str(h.get("host", "")),
            Text(status, color),
            f"{h.get('verified', 0)}/{h.get('files', 0)}",
        ]
        if check:
            row.append(common.human(int(h.get("need_bytes", 0))))
        else:
            row += [
                str(len(h.get("received") or [])),
                str(len(h.get("repaired") or [])),
                common.human(int(h.get("bytes_received", 0))),
            ]
        failed = ", ".join(str(f.get("name")) for f in h.get("failed") or [])
        detail = str(h.get("message", "")) + (f" failed: {failed}" if failed else "")
        row.append(detail.strip()[:160])
        table.add_row(*row)
    return table
