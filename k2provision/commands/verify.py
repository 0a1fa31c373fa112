"""`k2provision verify INVENTORY`: the smoke test alone (plan + the verify phase).

It runs the `verify` phase of playbooks/site.yml (the k2_verify role) through the shared run
flow, exactly what `ansible-playbook -i INVENTORY playbooks/site.yml --tags verify` does: the
endpoint lists the planned model, answers a chat completion, and answers one asked with a
`tools` definition with a parsed tool call (and, for a thinking model, its reasoning apart from
the content). The role keeps both answers as judged in the run record (`verify.json`); the
command shows the reply and the tool call that came back, or what was wrong with them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer
from rich.text import Text

from k2provision.commands.flow import HostRun, LiveView, RunHooks, run_on_hosts
from k2provision.commands.params import InventoryArg
from k2provision.core.records import Plan
from k2provision.run.display import console
from k2provision.run.runner import RunResult

RESULT_FILE = "verify.json"


def answer_lines(report: dict[str, Any]) -> list[Text]:
    """What the smoke test got back, one line per answer (the report the role wrote)."""
    lines = []
    chat = report.get("chat") or {}
    tool = report.get("tool") or {}
    reply = str(chat.get("content") or "").strip()
    mark = ("ok", "green") if chat.get("ok") else ("wrong", "red")
    lines.append(Text.assemble("chat: ", mark, f" reply {reply[:80]!r}"))
    if chat.get("reasoning"):
        size = len(str(chat["reasoning"]))
        lines.append(Text(f"reasoning: {size} characters, apart from the content"))
    call = tool.get("tool_call")
    mark = ("ok", "green") if tool.get("ok") else ("wrong", "red")
    seen = call["text"] if isinstance(call, dict) else "none"
    lines.append(Text.assemble("tool call: ", mark, f" {seen}"))
    keyless = report.get("keyless")
    if keyless is not None:
        mark = ("ok", "green") if str(keyless) == "401" else ("wrong", "red")
        lines.append(Text.assemble("without the API key: ", mark, f" HTTP {keyless}"))
    for part in (chat, tool):
        if part.get("message"):
            lines.append(Text(str(part["message"]), "red"))
    return lines


class VerifyHooks(RunHooks):
    """The smoke test's additions to the run flow: its answers in the record, then shown."""

    def extravars(self, plan: Plan, record: Path) -> dict[str, Any]:
        return {"k2_verify_report": str(record / RESULT_FILE)}

    def report(self, plan: Plan, result: RunResult, view: LiveView) -> None:
        super().report(plan, result, view)
        path = result.record_dir / RESULT_FILE
        if not path.exists():
            return
        console.print(
            Text.assemble(("endpoint", "bold"), f" {plan.endpoint} ({plan.served_model_name})")
        )
        for line in answer_lines(json.loads(path.read_text())):
            console.print(line, soft_wrap=True)


def verify(inventory: InventoryArg) -> None:
    """Smoke-test the endpoint: models, a chat completion, a parsed tool call; exit 0 or 1."""
    run = HostRun(command="verify", inventory=inventory, tags=("verify",))
    raise typer.Exit(run_on_hosts(run, VerifyHooks()))


def register(app: typer.Typer) -> None:
    """Add `verify` to the app."""
    app.command("verify")(verify)
