"""Rich output for plans, errors and runs. Output only; no decisions here.

Everything shown comes from data (host names, addresses, Ansible's output, values from the
inventory), so nothing printed is ever read as rich markup or emoji codes: both consoles have
markup, emoji and highlighting off, and styles are applied through `Text` objects only.
`fatal: [lab1]: UNREACHABLE`, `[/etc/x]` and `fd00:100::1` print exactly as they are.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.spinner import Spinner
from rich.table import Table
from rich.text import Text

from k2provision.core.records import Plan
from k2provision.errors import K2Error
from k2provision.plan.shapes import sizes_text
from k2provision.run.events import Event, HostResult, PlayStarted, Tally, TaskStarted


def _console(stderr: bool) -> Console:
    # Pipes and CI logs get wide lines instead of rich's 80-column default.
    stream = sys.stderr if stderr else sys.stdout
    return Console(
        stderr=stderr,
        width=None if stream.isatty() else 160,
        markup=False,
        emoji=False,
        highlight=False,
    )


console = _console(stderr=False)
err_console = _console(stderr=True)


def labelled(label: str, style: str, text: str) -> Text:
    """`label text` with only the label styled; `text` stays exactly as given."""
    return Text.assemble((label, style), " ", text)


def print_errors(error: K2Error, label: str = "error:") -> None:
    """One line per problem on stderr."""
    for problem in error.problems:
        err_console.print(labelled(label, "bold red", problem), soft_wrap=True)


def print_warnings(warnings: Iterable[str]) -> None:
    """One line per warning on stderr (stdout stays the command's own output)."""
    for warning in warnings:
        err_console.print(labelled("warning:", "yellow", warning), soft_wrap=True)


def print_unexpected(error: BaseException, where: str) -> None:
    """The one line an unexpected failure gets: what it was, and where the details are."""
    err_console.print(
        labelled(
            "error:",
            "bold red",
            f"unexpected {type(error).__name__}: {error}; details: {where}",
        ),
        soft_wrap=True,
    )


def _sizes(plan: Plan, pool_name: str) -> str:
    return sizes_text(next(p for p in plan.pools if p.name == pool_name).parallel)


def plan_table(plan: Plan) -> Table:
    """Hosts, roles, ranks, GPUs and what each runs."""
    table = Table(
        title=f"{plan.model} on {plan.engine} {plan.engine_version} ({plan.layout})",
        title_justify="left",
    )
    fleet = any(p.instances for p in plan.pools)
    columns = ("host", "address", "role", *(("instance",) if fleet else ()), "rank", "GPUs")
    for column in (*columns, "runs (stage)"):
        table.add_column(column)
    for host in plan.hosts:
        runs = ", ".join(f"{p.name} ({p.stage})" for p in host.processes) or "-"
        instance = (host.instance or "-",) if fleet else ()
        table.add_row(
            host.name,
            host.address,
            host.role,
            *instance,
            str(host.node_rank),
            str(host.gpus),
            runs,
        )
    return table


def instance_table(plan: Plan) -> Table:
    """A fleet's instances: hosts, layout, master (with the ports its rank 0 binds) and the
    URL the router reaches each at."""
    table = Table(title="instances (each behind the router)", title_justify="left")
    for column in ("instance", "hosts", "parallel", "master", "master's ports", "URL"):
        table.add_column(column)
    hosts_by_name = {h.name: h for h in plan.hosts}
    for pool in plan.pools:
        for i in pool.members():
            hosts = ", ".join(i.hosts) if len(i.hosts) <= 2 else f"{i.hosts[0]} … {i.hosts[-1]}"
            master = hosts_by_name[i.master]
            mine = {
                p.name for p in master.processes if p.instance and p.instance.name == i.instance
            }
            bound = ", ".join(f"{b.setting}={b.port}" for b in master.ports if b.process in mine)
            table.add_row(
                i.instance or pool.name,
                f"{hosts} ({len(i.hosts)})",
                sizes_text(i.parallel),
                f"{i.master} ({i.master_address})",
                bound or "-",
                i.url or "-",
            )
    return table


def world_lines(plan: Plan) -> list[Text]:
    """Each fleet instance's own MPI world, where its rank 0 starts one (TensorRT-LLM): the
    ranks and the hosts mpirun reaches through their sshd (none: no such instance)."""
    hosts_by_name = {h.name: h for h in plan.hosts}
    lines = []
    for pool in plan.pools:
        for i in pool.instances:
            for process in hosts_by_name[i.master].processes:
                argv = list(process.argv)
                if not argv or argv[0] != "mpirun" or "-np" not in argv or "-H" not in argv:
                    continue
                ranks, hosts = argv[argv.index("-np") + 1], argv[argv.index("-H") + 1]
                lines.append(
                    Text.assemble(
                        "mpirun world: ",
                        (i.instance, "bold"),
                        f": {ranks} ranks on {hosts} (rank 0 on {i.master}; each host's "
                        f"sshd on {plan.ssh_port} takes this instance's hosts only)",
                    )
                )
    return lines


def router_lines(plan: Plan) -> list[Text]:
    """Each of a fleet's routers with its command line and the workers its launch registers
    (those it cannot name itself: a vLLM or TensorRT-LLM fleet's), which between them list
    every instance (none: no fleet)."""
    urls = [i.url for p in plan.pools for i in p.instances]
    if not urls:
        return []
    lines = []
    for host in plan.hosts:
        for process in host.processes:
            later = [str(w["url"]) for w in process.registrar.workers] if process.registrar else []
            if not all(url in process.argv or url in later for url in urls):
                continue
            registers = f" (then registers {' '.join(later)} by model id)" if later else ""
            lines.append(
                Text.assemble(
                    "router: ",
                    (f"{process.name} on {host.name}", "bold"),
                    ": ",
                    " ".join(process.argv),
                    registers,
                )
            )
    return lines


def image_lines(plan: Plan) -> list[Text]:
    """Each image the hosts run: built from containers/ or pulled, once, on the first host
    that runs it (unless a host holds it already), then streamed to the others."""
    lines = []
    for image in plan.images:
        fetch = f"built from containers/{image.build}" if image.build else "pulled"
        hosts = len(image.hosts)
        lines.append(
            Text.assemble(
                "image: ",
                (image.ref, "bold"),
                f" {fetch} once on {image.hosts[0]}, streamed to {hosts - 1} other "
                f"host{'s' if hosts != 2 else ''}, verified by image ID"
                if hosts > 1
                else f" {fetch} on {image.hosts[0]}",
            )
        )
    return lines


def drained_line(plan: Plan) -> Text | None:
    """The instances `k2provision drain` took out, kept stopped and out of every router, and
    how they come back (None: nothing drained)."""
    if not plan.fleet.drained:
        return None
    named = " ".join(plan.fleet.drained_named)
    return Text.assemble(
        ("drained: ", "yellow"),
        f"{', '.join(plan.fleet.drained)} on {', '.join(plan.fleet.drained_hosts)}: stopped and "
        f"out of every router until `k2provision return INVENTORY {named}`",
    )


def spare_lines(plan: Plan) -> list[Text]:
    """The spares: those in failed hosts' places (heal) and how each is undone, then the idle
    ones."""
    lines = [
        Text.assemble(
            ("replaced: ", "yellow"),
            f"{spare} serves in place of {failed} (k2provision heal); {failed} is in no play "
            f"until `k2provision return INVENTORY {failed}`",
        )
        for failed, spare in plan.fleet.replaced.items()
    ]
    if plan.fleet.spares:
        lines.append(
            Text(
                f"spares: {', '.join(plan.fleet.spares)}: prepared, holding the weights, serving "
                "nothing until k2provision heal puts one in a failed host's place"
            )
        )
    return lines


def front_line(plan: Plan) -> Text | None:
    """The front tier: the floating address, who may hold it (VRRP priority, highest first)
    and the routers every HAProxy spreads requests over (None: one router or none)."""
    front = plan.front
    if front is None:
        return None
    holders = ", ".join(f"{h.name} ({h.priority})" for h in front.hosts)
    routers = ", ".join(f"{r.host} {r.url}" for r in front.routers)
    return Text.assemble(
        "front: ",
        (f"{front.address}/{front.prefix}", "bold"),
        f" (VRRP id {front.vrid}) held by one of {holders}; HAProxy on :{front.port} of each "
        f"sends to every healthy router: {routers}",
    )


def fit_table(plan: Plan) -> Table:
    """Memory fit per pool, per GPU: the derived fraction, weights, reserve and KV cache."""
    table = Table(title="memory fit per GPU", title_justify="left")
    for column in (
        "pool",
        "parallel",
        "fraction",
        "weights GiB",
        "reserve GiB",
        "KV GiB",
        "KV tokens/replica",
        "context",
        "fits",
    ):
        table.add_column(column)
    for r in plan.fit:
        count = len(next(p for p in plan.pools if p.name == r.pool).instances)
        table.add_row(
            f"{r.pool} (each of {count})" if count else r.pool,
            _sizes(plan, r.pool),
            f"{r.mem_fraction:g}",
            f"{r.weights_gib}",
            f"{r.reserve_gib}",
            f"{r.kv_gib} ({r.kv_dtype})",
            f"{r.kv_tokens_per_replica:,}",
            f"{r.context_length:,}",
            Text("yes", style="green") if r.fits else Text("no", style="red"),
        )
    return table


def reserve_table(plan: Plan) -> Table:
    """What the reserve holds, per GPU and term: CUDA graphs, NCCL / all-reduce and expert
    all-to-all buffers for the chosen sizes, activations, runtime, encoder, margin; the
    terms scaled to a published measurement are named under the table."""
    table = Table(title="reserve per GPU (GiB): graphs and buffers", title_justify="left")
    for column in (
        "pool",
        "CUDA graphs",
        "collectives",
        "all2all",
        "activations",
        "runtime",
        "encoder",
        "margin",
        "total",
    ):
        table.add_column(column)
    notes = []
    for r in plan.fit:
        m = r.reserve
        table.add_row(
            r.pool,
            f"{m.cuda_graphs}",
            f"{round(m.comm_buffers - m.all2all, 2)}",
            f"{m.all2all}",
            f"{m.activations}",
            f"{m.runtime}",
            f"{m.encoder}",
            f"{m.margin}",
            f"{r.reserve_gib}",
        )
        if m.calibration:
            notes.append(f"[{r.pool}] calibrated: {m.calibration}")
    if notes:
        table.caption = Text("\n".join(notes))  # not markup: pool names are in brackets
        table.caption_justify = "left"
    return table


def lab_banner(plan: Plan, *, ran: bool = False) -> Text:
    """The loud line every lab-profile plan and run carries."""
    style = "bold yellow"
    if ran:
        return Text("LAB PROFILE was on: hardware steps skipped, stand-in engines.", style)
    image = plan.hosts[0].processes[0].image if plan.hosts and plan.hosts[0].processes else ""
    return Text(f"LAB PROFILE: hardware steps skipped, stand-in engine image {image}", style)


def print_plan(plan: Plan) -> None:
    """The human view of a plan on stdout; its warnings on stderr."""
    if plan.lab:
        console.print(lab_banner(plan))
    console.print(plan_table(plan))
    console.print(fit_table(plan))
    console.print(reserve_table(plan))
    if routers := router_lines(plan):
        console.print(instance_table(plan))
        for world in world_lines(plan):
            console.print(world, soft_wrap=True)
        for router in routers:
            console.print(router, soft_wrap=True)
    if front := front_line(plan):
        console.print(front, soft_wrap=True)
    if drained := drained_line(plan):
        console.print(drained, soft_wrap=True)
    for line in spare_lines(plan):
        console.print(line, soft_wrap=True)
    for line in image_lines(plan):
        console.print(line, soft_wrap=True)
    console.print(Text.assemble("endpoint: ", (plan.endpoint, "bold")))
    if plan.container.compile_cache:
        console.print(
            Text.assemble(
                "compile caches: ",
                (plan.container.compile_cache, "bold"),
                " (host volume in every engine container: restarts reuse compiled kernels)",
            )
        )
    sys.stdout.flush()
    print_warnings(plan.warnings)


def failure_line(event: HostResult) -> Text:
    """`failed HOST: TASK: MESSAGE`, the status in red, the rest exactly as Ansible said it."""
    return labelled(event.status, "red", f"{event.host}: {event.task}: {event.message}")


def host_table(hosts: list[str], tally: Tally, *, title: str | None = "run summary") -> Table:
    """Per-host ok/changed/failed/unreachable counts (and the first failure)."""
    table = Table(title=title, title_justify="left")
    for column in ("host", "ok", "changed", "failed", "unreachable", "first failure"):
        table.add_column(column)
    for host in hosts:
        c = tally.counts.get(host, {})
        table.add_row(
            host,
            str(c.get("ok", 0)),
            str(c.get("changed", 0)),
            Text(str(c["failed"]), "red") if c.get("failed") else "0",
            Text(str(c["unreachable"]), "red") if c.get("unreachable") else "0",
            tally.failures.get(host, "")[:120],
        )
    return table


class RunView:
    """Live view of a playbook run: the current phase and task, and per-host tallies."""

    def __init__(self, hosts: list[str]) -> None:
        self.hosts = list(hosts)
        self.phase = ""
        self.task = ""
        self.tally = Tally()
        self.spinner = Spinner("dots", text=Text("starting"))
        # Drawn from _render at each refresh, so a subclass's additions (apply's image streams)
        # move between events too.
        self.live = Live(
            console=console, refresh_per_second=8, transient=True, get_renderable=self._render
        )

    def _render(self) -> Any:
        self.spinner.text = Text(f"{self.phase} > {self.task}" if self.phase else self.task)
        return Group(self.spinner, host_table(self.hosts, self.tally, title=None))

    def __enter__(self) -> RunView:
        self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.live.__exit__(None, None, None)

    def on_event(self, event: Event) -> None:
        """Fold one typed runner event into the view."""
        if isinstance(event, PlayStarted):
            self.phase = event.name
        elif isinstance(event, TaskStarted):
            self.task = event.name
        elif isinstance(event, HostResult):
            if event.host not in self.hosts:
                self.hosts.append(event.host)
            self.tally.add(event)
            if event.status in {"failed", "unreachable"} and not event.ignored:
                console.print(failure_line(event), soft_wrap=True)
            for line in event.differences:
                console.print(labelled(f"{event.host}:", "yellow", line), soft_wrap=True)
