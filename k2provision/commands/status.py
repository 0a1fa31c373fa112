"""`k2provision status INVENTORY [--format json] [--watch [SECONDS]]`: what runs where, now.

Every host at once, one SSH round trip each (remote.py; status_probe.py asks the registry's
questions): per planned process its container's state and uptime, drift against the plan's
spec hash, its health gate now, restarts and the last error-looking log line, and per host the
GPU memory in use. Then the
endpoint: /v1/models, and for PD the router's /readiness and workers. Exit 0 only when every
planned process runs its planned spec and the endpoint answers; 1 otherwise, one line per host
naming what is wrong; 2 for bad input. Each run writes a record (status.json, summary.json).
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, replace
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlsplit

import typer
from rich.table import Table
from rich.text import Text
from typer._click.core import Context  # typer 0.26 vendors click (pinned in pyproject)
from typer.core import TyperCommand

from k2provision.commands.flow import EXIT_FAILED, EXIT_OK, load_plan
from k2provision.commands.params import FormatOpt, InventoryArg, OutputFormat
from k2provision.core.inventory import read_inventory
from k2provision.core.records import Plan
from k2provision.engines import layout_named
from k2provision.errors import ArgumentError, K2Error
from k2provision.ops.connect import SshTarget
from k2provision.ops.endpoint_access import EndpointAccess, endpoint_access
from k2provision.ops.forward import Dial, connection, endpoint_address, port_forward, reachable
from k2provision.ops.front_status import front_view
from k2provision.ops.remote import run_all, ssh_inventory
from k2provision.ops.status_probe import (
    EndpointStatus,
    HostStatus,
    InstanceStatus,
    RouterWorker,
    fleet_status,
    host_status,
    human_duration,
    model_ids,
    probe_script,
    readiness_detail,
    router_workers,
)
from k2provision.plan.monitoring import where_line
from k2provision.run.cancel import Interrupted, exit_code, stopping
from k2provision.run.display import console, err_console, print_warnings, spare_lines
from k2provision.run.runner import new_record_dir

SCHEMA_VERSION = 1
PROBE_TIMEOUT_S = 20.0
HTTP_TIMEOUT_S = 5.0
WATCH_DEFAULT_S = 5.0
# The longest --watch interval: a day.
WATCH_MAX_S = 86400.0


def _is_number(word: str) -> bool:
    try:
        float(word)
    except ValueError:
        return False
    return True


def watch_args(args: list[str]) -> list[str]:
    """A bare `--watch` (no SECONDS after it) as `--watch=5`: Typer options always take a
    value, and `--watch [SECONDS]` reads better than a second option."""
    out = []
    for i, word in enumerate(args):
        following = args[i + 1] if i + 1 < len(args) else ""
        out.append(
            f"--watch={WATCH_DEFAULT_S:g}"
            if word == "--watch" and not _is_number(following)
            else word
        )
    return out


class StatusCommand(TyperCommand):
    """`status`, whose --watch takes an optional value."""

    def parse_args(self, ctx: Context, args: list[str]) -> list[str]:
        return list(super().parse_args(ctx, watch_args(args)))


def _get_json(url: str, access: EndpointAccess) -> tuple[int | None, Any, str]:
    """GET `url` with the endpoint's key and CA -> (status, JSON body or None, error)."""
    request = urllib.request.Request(url, headers=access.headers)
    try:
        if access.dial is not None:
            status, raw = _get_dialled(url, access)
        else:
            with urllib.request.urlopen(
                request, timeout=HTTP_TIMEOUT_S, context=access.context
            ) as reply:
                status, raw = int(reply.status), reply.read()
    except urllib.error.HTTPError as error:
        status, raw = int(error.code), error.read()
    except (OSError, ValueError) as error:
        reason = getattr(error, "reason", error)
        return None, None, f"no answer ({reason})"
    try:
        return status, json.loads(raw), ""
    except ValueError:
        return status, None, ""


def _get_dialled(url: str, access: EndpointAccess) -> tuple[int, bytes]:
    """GET through the endpoint's SSH forward (the URL's host still named and checked)."""
    conn = connection(url, HTTP_TIMEOUT_S, access.context, access.dial)
    try:
        parts = urlsplit(url)
        conn.request("GET", parts.path or "/", headers=access.headers)
        reply = conn.getresponse()
        return int(reply.status), reply.read()
    finally:
        conn.close()


def endpoint_status(plan: Plan, access: EndpointAccess) -> EndpointStatus:
    """The plan's endpoint now, asked from here (with its key, checking its certificate)."""
    base = plan.endpoint.rstrip("/")
    status, body, error = _get_json(f"{base}/v1/models", access)
    models = model_ids(body)
    if not error and status != 200:
        error = f"/v1/models answered HTTP {status}"
    elif not error and not models:
        error = "/v1/models answered without a model"
    routed = layout_named(plan.engine, plan.layout).disaggregated
    if not routed and not any(pool.instances for pool in plan.pools):
        return EndpointStatus(base, models, error)
    ready_status, ready_body, ready_error = _get_json(f"{base}/readiness", access)
    _, workers_body, _ = _get_json(f"{base}/workers", access)
    return EndpointStatus(
        base,
        models,
        error,
        router_ready=ready_status == 200,
        router_detail=ready_error or readiness_detail(ready_status, ready_body),
        workers=router_workers(workers_body),
    )


def gather(
    plan: Plan, targets: dict[str, SshTarget], access: EndpointAccess | None = None
) -> tuple[list[HostStatus], EndpointStatus]:
    """Every host's probe and the endpoint, all at once."""
    missing = [h.name for h in plan.hosts if h.name not in targets]
    if missing:
        raise K2Error([f"{name}: in the plan but not in the inventory's hosts" for name in missing])
    drained = set(plan.fleet.drained_hosts)
    # A drained host is asked about itself (GPUs, ports), not about the processes it stopped.
    probed = [
        h.model_copy(update={"processes": ()}) if h.name in drained else h for h in plan.hosts
    ]
    commands = {h.name: (targets[h.name], probe_script(plan, h)) for h in probed}
    with ThreadPoolExecutor(max_workers=1) as pool:
        endpoint = pool.submit(endpoint_status, plan, access or EndpointAccess())
        replies = run_all(commands, timeout=PROBE_TIMEOUT_S)
        hosts = []
        for h in probed:
            reply = replies[h.name]
            if not reply.reached:
                found = HostStatus(h.name, h.role, unreachable=reply.unreachable)
            else:
                found = host_status(plan, h, reply.stdout)
            hosts.append(replace(found, drained=h.name in drained))
        return hosts, endpoint.result()


def problem_lines(
    hosts: list[HostStatus],
    endpoint: EndpointStatus,
    fleet: Sequence[InstanceStatus] = (),
    front: Sequence[str] = (),
) -> list[str]:
    """One line per host with something wrong, then the front's (one holder of its address),
    the endpoint's, then each instance of a fleet that is down."""
    lines = []
    for host in hosts:
        problems = host.problems
        if problems:
            prefix = f"{host.host}: "
            lines.append(prefix + "; ".join(p.removeprefix(prefix) for p in problems))
    return lines + list(front) + endpoint.problems + [i.problem for i in fleet if i.problem]


def document(
    inventory: Path,
    plan: Plan,
    hosts: list[HostStatus],
    endpoint: EndpointStatus,
    record: Path,
    fleet: Sequence[InstanceStatus],
    front_problems: Sequence[str],
) -> dict[str, Any]:
    """`status --format json` (schema 1; documented in docs/day-two.md)."""
    problems = problem_lines(hosts, endpoint, fleet, front_problems)
    return {
        "schema": SCHEMA_VERSION,
        "inventory": str(inventory),
        "checked_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "engine": plan.engine,
        "layout": plan.layout,
        "model": plan.model,
        "ok": not problems,
        "hosts": [h.as_json() for h in hosts],
        "endpoint": endpoint.as_json(),
        "instances": [{**asdict(i), "up": i.up, "problem": i.problem} for i in fleet],
        "spares": list(plan.fleet.spares),
        "replaced": dict(plan.fleet.replaced),
        "problems": problems,
        "record": str(record),
    }


def _gpus(host: HostStatus) -> str:
    if host.unreachable:
        return "-"
    if host.gpus is None:
        return "no nvidia-smi"
    return " ".join(f"{g.index}:{g.used_mib}/{g.total_mib}MiB" for g in host.gpus) or "none"


def _tail(text: str, width: int) -> str:
    """The end of a long line (where a log line says what went wrong)."""
    return text if len(text) <= width else "…" + text[-(width - 1) :]


def status_table(hosts: list[HostStatus]) -> Table:
    """One row per host and planned process; data is shown exactly as it is."""
    table = Table(title="status", title_justify="left")
    columns = ("host", "process", "container", "state", "uptime", "spec", "gate", "restarts",
               "GPU memory used", "last error in log")  # fmt: skip
    for column in columns:
        table.add_column(column)
    for host in hosts:
        if host.drained:
            back = Text(f"drained (k2provision return {host.host})", "yellow")
            table.add_row(host.host, "-", "-", back, "", "", "", "", _gpus(host), "")
            continue
        if host.unreachable or not host.processes:
            state = Text(f"unreachable: {host.unreachable}", "red") if host.unreachable else "-"
            table.add_row(host.host, "-", "-", state, "", "", "", "", _gpus(host), "")
            continue
        for i, p in enumerate(host.processes):
            table.add_row(
                host.host if i == 0 else "",
                p.process,
                p.container,
                Text(p.state, "green" if p.state == "running" else "red"),
                human_duration(p.uptime_s),
                Text(p.spec, "red") if p.spec == "drift" else p.spec,
                Text(p.gate, "red") if p.gate.startswith("failing") else p.gate,
                "-" if p.restarts is None else str(p.restarts),
                _gpus(host) if i == 0 else "",
                _tail(p.last_error, 80),
            )
    return table


def fleet_line(fleet: Sequence[InstanceStatus], workers: Sequence[RouterWorker]) -> str:
    """`fleet: 3/4 instances up (prefill 2/2, decode 1/2), 3 requests in flight`: what is left
    of each pool's capacity (its instances are equal), and the router's load."""
    up = sum(1 for i in fleet if i.up)
    line = f"fleet: {up}/{len(fleet)} instances up"
    pools: dict[str, list[bool]] = {}
    for i in fleet:
        pools.setdefault(i.instance.rsplit("-", 1)[0], []).append(i.up)
    if len(pools) > 1:
        line += " (" + ", ".join(f"{p} {sum(u)}/{len(u)}" for p, u in pools.items()) + ")"
    if drained := [i.instance for i in fleet if i.drained]:
        line += f", {len(drained)} drained ({', '.join(drained)})"
    loads = [w.load for w in workers if w.load is not None]
    if loads:
        line += f", {sum(loads)} requests in flight"
    return line


def print_human(
    hosts: list[HostStatus],
    endpoint: EndpointStatus,
    record: Path,
    fleet: Sequence[InstanceStatus] = (),
    front: tuple[list[str], list[str]] = ([], []),
    notes: Sequence[Text] = (),
) -> None:
    """The table, the endpoint, the front (`front`: front_view's lines and problems), the
    `notes` (the spares), then one line per host with a problem, and the verdict."""
    console.print(status_table(hosts))
    models = ", ".join(endpoint.models) or "-"
    answer = Text("answers", "green") if endpoint.answers else Text(endpoint.error, "red")
    console.print(Text.assemble("endpoint ", endpoint.url, ": ", answer, f" (models: {models})"))
    if endpoint.router_ready is not None:
        word = Text(endpoint.router_detail, "green" if endpoint.router_ready else "red")
        console.print(Text.assemble("router readiness: ", word))
        for w in endpoint.workers:
            health = Text("healthy", "green") if w.healthy else Text("unhealthy", "red")
            load = "" if w.load is None else f", {w.load} in flight"
            console.print(Text.assemble(f"  {w.kind} worker {w.url}: ", health, load))
    for i in fleet:
        state = Text("up", "green") if i.up else Text(f"down (router: {i.router})", "red")
        if i.drained:
            state = Text("drained", "yellow")
        console.print(
            Text.assemble(f"instance {i.instance} ({', '.join(i.hosts)}) {i.url}: ", state)
        )
    if fleet:
        console.print(fleet_line(fleet, endpoint.workers))
    for line in front[0]:
        console.print(line, soft_wrap=True)
    for note in notes:
        console.print(note, soft_wrap=True)
    problems = problem_lines(hosts, endpoint, fleet, front[1])
    for line in problems:
        console.print(Text.assemble(("problem: ", "bold red"), line), soft_wrap=True)
    verdict = Text("ok", "green") if not problems else Text("not ok", "red")
    console.print(Text.assemble("status ", verdict, f"; record: {record}"))


def check_once(
    inventory: Path,
    plan: Plan,
    targets: dict[str, SshTarget],
    record: Path,
    as_json: bool,
    access: EndpointAccess,
    monitoring: str = "",
) -> int:
    """One status round: gather, show, record; the exit code."""
    hosts, endpoint = gather(plan, targets, access)
    fleet = fleet_status(plan, hosts, endpoint.workers)
    front = front_view(plan, hosts)
    doc = document(inventory, plan, hosts, endpoint, record, fleet, front[1])
    (record / "status.json").write_text(json.dumps(doc, indent=2) + "\n")
    code = EXIT_OK if doc["ok"] else EXIT_FAILED
    summary = {"status": "successful" if doc["ok"] else "failed", "rc": code,
               "problems": doc["problems"], "checked_at": doc["checked_at"]}  # fmt: skip
    (record / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    if as_json:
        typer.echo(json.dumps(doc, indent=2))
    else:
        print_human(hosts, endpoint, record, fleet, front, spare_lines(plan))
        if monitoring:
            console.print(monitoring, soft_wrap=True)
    sys.stdout.flush()
    return code


def status(
    inventory: InventoryArg,
    output_format: FormatOpt = OutputFormat.table,
    watch: Annotated[
        float | None,
        typer.Option(
            "--watch",
            metavar="[SECONDS]",
            help=f"check again every SECONDS ({WATCH_DEFAULT_S:g} when not given) until Ctrl-C",
        ),
    ] = None,
    via_bastion: Annotated[
        bool,
        typer.Option(
            "--via-bastion",
            help="read the endpoint through an SSH port forward to its host, "
            "connected as Ansible connects (ProxyJump included); automatic when the endpoint "
            "does not answer from here",
        ),
    ] = False,
) -> None:
    """Per host and planned process: state, uptime, drift, health gate, GPU memory, restarts,
    last error; then the endpoint. Exit 0 only when all runs as planned and the endpoint
    answers."""
    if watch is not None and not 0 < watch <= WATCH_MAX_S:  # NaN fails too
        raise ArgumentError(
            [f"--watch {watch:g}: expected a positive number of seconds, at most {WATCH_MAX_S:g}"]
        )
    loaded = load_plan(inventory)
    _, targets = ssh_inventory(inventory)
    access = endpoint_access(loaded.plan.access)
    print_warnings(loaded.notices)
    record = new_record_dir("status", loaded.plan)
    as_json = output_format is OutputFormat.json
    plan = loaded.plan
    monitoring = where_line(plan, read_inventory(inventory)[0].get("monitoring", []))
    address = endpoint_address(plan.endpoint)
    with contextlib.ExitStack() as stack:
        if (via_bastion or not reachable(address)) and plan.endpoint_host in targets:
            try:
                local = stack.enter_context(port_forward(targets[plan.endpoint_host], address))
            except K2Error as error:  # the hosts' table still comes; the endpoint says why
                err_console.print(
                    f"warning: endpoint {plan.endpoint}: {error}; asked directly",
                    soft_wrap=True,
                    markup=False,
                )
            else:
                access = replace(access, dial=Dial(local))
                err_console.print(
                    f"endpoint {plan.endpoint}: read through an SSH port "
                    f"forward to {plan.endpoint_host} (local "
                    f"{local[0]}:{local[1]})",
                    soft_wrap=True,
                )
        code = check_once(inventory, plan, targets, record, as_json, access, monitoring)
        if watch is None:
            raise typer.Exit(code)
        try:
            with stopping():  # a stop signal ends the watch; each check's SSH sessions close
                while True:
                    time.sleep(watch)
                    if not as_json and sys.stdout.isatty():
                        console.clear()
                    code = check_once(inventory, plan, targets, record, as_json, access, monitoring)
        except Interrupted as stop:
            raise typer.Exit(exit_code(stop.signum)) from None


def register(app: typer.Typer) -> None:
    """Add `status` to the app."""
    app.command("status", cls=StatusCommand)(status)
