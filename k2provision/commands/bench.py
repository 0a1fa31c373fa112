"""`k2provision bench INVENTORY [--workload NAME] [--num-prompts N] [--concurrency C[,C...]]
[--gpu-hour-price USD] [--input-len N --output-len N] [--tokenizer T]
[--client cluster|controller] [--client-python PATH]`.

Runs the engine's own pinned benchmark client (k2provision/ops/bench.py picks it and builds its
argv) against the plan's endpoint, once per concurrency value: by default inside the cluster, in
the engine's image on the endpoint's host over SSH as Ansible connects (bastions included), where
the client and the model's tokenizer are; with --client controller from this machine. It shows
throughput (total, per node, per GPU, beside the published figure where one exists),
TTFT / ITL / end-to-end p50, p90, p99 and the cost per 1M tokens. The run record holds
bench.json (schema 1), bench.png (throughput and latency against concurrency), each run's
client log and result file. Exit 0 when every run completed every request; 1 when the client
failed or requests failed (its last lines shown); 2 for bad input.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from k2provision.commands.flow import EXIT_FAILED, EXIT_OK, load_plan
from k2provision.commands.params import InventoryArg
from k2provision.core.records import Plan
from k2provision.errors import ArgumentError, K2Error
from k2provision.ops.bench import (
    CLIENT_PLACES,
    DEFAULT_GPU_HOUR_USD,
    DEFAULT_NUM_PROMPTS,
    LAB_NOTICE,
    NO_CLIENT_RC,
    WORKLOAD_NAMES,
    Client,
    ClusterRun,
    Point,
    RunSpec,
    Throughput,
    ca_env,
    ca_text,
    client_argv,
    client_env,
    client_for,
    cluster_argv,
    cluster_run,
    cluster_script,
    concurrency_list,
    document,
    parse_result,
    point,
    published_for,
    sanitized,
    scale_of,
    split_output,
    workload,
)
from k2provision.ops.connect import SshTarget, ssh_command, unreachable_reason
from k2provision.ops.endpoint_access import read_secret
from k2provision.ops.remote import SSH_UNREACHABLE, ssh_inventory
from k2provision.run.cancel import (
    CURRENT,
    Interrupted,
    cleaning,
    end_child,
    exit_code,
    signal_name,
    stopping,
)
from k2provision.run.display import console, err_console, print_warnings
from k2provision.run.runner import new_record_dir

IMPORT_TIMEOUT_S = 300
TAIL_LINES = 30
# Bounds of the numeric options: far past any real run, short of overflow and NaN.
MAX_NUM_PROMPTS = 1_000_000
MAX_GPU_HOUR_USD = 10_000.0


def check_client(python: str, client: Client, env: dict[str, str]) -> None:
    """The client's module imports under `python`, or K2Error (exit 2) with the fix."""
    if not Path(python).exists():
        raise K2Error(
            [
                f"--client-python {python}: no such file; name the Python of an "
                f"environment where `{client.module}` imports"
            ]
        )
    try:
        out = subprocess.run(
            [python, "-c", f"import {client.module}"],
            capture_output=True,
            text=True,
            timeout=IMPORT_TIMEOUT_S,
            env=env,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        raise K2Error([f"--client-python {python}: cannot run it ({error})"]) from None
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["(no output)"])[-1]
        pins = client.install
        raise K2Error(
            [
                f"--client-python {python}: `import {client.module}` fails ({last}); "
                f"install the pinned client there, {pins}, or pass --client-python "
                "PATH of a Python that has it"
            ]
        )


def client_process_env(key: str | None = None, ca_file: str | None = None) -> dict[str, str]:
    """The environment a client process runs in: this one's, the clients' own settings, and
    for a controller-side client the endpoint's key (OPENAI_API_KEY) and CA (as ops/bench.py
    `ca_env` names it), which both pinned clients read from the environment. Built per run and
    handed down, never kept in module state."""
    return {
        **os.environ,
        **client_env(),
        **({"OPENAI_API_KEY": key} if key else {}),
        **(ca_env(ca_file) if ca_file else {}),
    }


def resolve_tokenizer(plan: Plan, tokenizer: str | None) -> str:
    """--tokenizer, else the model directory when it is on this machine."""
    if tokenizer:
        return tokenizer
    if Path(plan.model_dir, "config.json").is_file() and any(
        Path(plan.model_dir).glob("tokenizer*")
    ):
        return str(plan.model_dir)
    raise K2Error(
        [
            f"no tokenizer: the model directory {plan.model_dir} is not on this machine; pass "
            "--tokenizer with the model's directory here (its tokenizer files are enough) or a "
            "Hugging Face id already in the local cache (bench never downloads)"
        ]
    )


def _tail(path: Path, n: int = TAIL_LINES) -> list[str]:
    lines = path.read_text(errors="replace").splitlines() if path.exists() else []
    return lines[-n:]


def run_client(
    argv: list[str],
    log: Path,
    label: str,
    env: dict[str, str],
    stdin: bytes | None = None,
    *,
    says: str = "client",
) -> int:
    """The client, its output to `log`, a spinner meanwhile; its exit status. A stop signal
    ends the client and what it started (its own process group), then stops the command.
    `stdin`, when given, is written to the client's input (a secret never goes in argv)."""
    started = time.monotonic()
    with log.open("wb") as sink, console.status(f"{label}: running the client"), stopping():
        # A signal while Popen is still returning would leave the client started and not
        # ended: it is noted meanwhile, and acted on once the client is ours to end.
        with cleaning(CURRENT):
            proc = subprocess.Popen(
                argv,
                stdout=sink,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                stdin=subprocess.DEVNULL if stdin is None else subprocess.PIPE,
            )
        if CURRENT.signum is not None:
            end_child(proc)
            raise Interrupted(CURRENT.signum)
        try:
            if proc.stdin is not None:
                proc.stdin.write(stdin or b"")
                proc.stdin.close()
            rc = proc.wait()
        except Interrupted:
            end_child(proc)
            raise
    console.print(f"{label}: {says} exited {rc} after {time.monotonic() - started:.0f} s")
    return rc


@dataclass(frozen=True)
class InCluster:
    """The host and image an in-cluster client runs in, and how to reach the host."""

    run: ClusterRun
    target: SshTarget


def in_cluster_target(inventory: Path, plan: Plan) -> InCluster:
    """The plan's client host with its connection settings from the inventory."""
    run = cluster_run(plan)
    _, targets = ssh_inventory(inventory)
    if run.host not in targets:
        raise K2Error([f"{run.host}: in the plan but not in the inventory's hosts"])
    return InCluster(run, targets[run.host])


def run_in_cluster(
    where: InCluster,
    client: Client,
    spec: RunSpec,
    key: str | None,
    ca: str | None,
    out_dir: Path,
    label: str,
) -> int:
    """One client run on the cluster's host: its log and result file land in `out_dir` as a
    controller run leaves them; the exit status is the client's (SSH_UNREACHABLE with the
    reason in the log when the host was not reached)."""
    script = cluster_script(client, where.run, spec, with_key=key is not None, ca_pem=ca)
    argv = ssh_command(where.target, script)
    raw = out_dir / "host-output.log"
    rc = run_client(
        argv,
        raw,
        label,
        client_process_env(),
        stdin=(key + "\n").encode() if key else b"",
        says=f"ssh to {where.run.host}",
    )
    answer = split_output(raw.read_text(errors="replace"))
    raw.unlink()
    log = out_dir / "client.log"
    if answer.rc is None:
        reason = (
            unreachable_reason(where.target, argv, answer.log)
            if rc == SSH_UNREACHABLE
            else f"the host script ended with {rc} before the client ran"
        )
        log.write_text(answer.log + f"{where.run.host}: {reason}\n")
        return rc if rc else 1
    if answer.rc == NO_CLIENT_RC:
        log.write_text(
            answer.log + f"{where.run.host}: `import {client.module}` fails in "
            f"{where.run.image}, which lacks the engine's pinned client; fix: run "
            "the engine's own image there, or --client controller with "
            "--client-python\n"
        )
        return answer.rc
    console.print(f"{label}: the client exited {answer.rc} on {where.run.host}")
    log.write_text(answer.log)
    if answer.result.strip():
        (out_dir / client.result_name).write_text(answer.result)
    return answer.rc


def _published(t: Throughput) -> tuple[str, str]:
    if t.published_percent is None or t.published_per_node is None:
        return "-", "-"
    return f"{t.published_per_node:,.0f}", f"{t.published_percent:.0f}%"


def _usd(value: float | None) -> str:
    return "-" if value is None else f"${value:,.4f}"


def _concurrency(p: Point) -> str:
    return "all" if p.concurrency is None else str(p.concurrency)


def tables(points: list[Point]) -> tuple[Table, Table]:
    """Throughput (per node, per GPU, against the published figure) and cost per
    concurrency and kind of token; latency percentiles per concurrency."""
    rates = Table(title="throughput (tok/s) and cost", title_justify="left")
    for column in (
        "concurrency",
        "done",
        "tokens",
        "tok/s",
        "per node",
        "per GPU",
        "published/node",
        "% of published",
        "$ per 1M",
    ):
        rates.add_column(column, justify="left" if column == "tokens" else "right")
    for p in points:
        for i, kind in enumerate(("input", "output", "total")):
            t = p.throughput[kind]
            rates.add_row(
                _concurrency(p) if i == 0 else "",
                f"{p.completed}/{p.completed + p.failed}" if i == 0 else "",
                kind,
                f"{t.total:,.0f}",
                f"{t.per_node:,.0f}",
                f"{t.per_gpu:,.0f}",
                *_published(t),
                _usd(p.cost_usd_per_1m.get(kind)),
                end_section=kind == "total",
            )
    latency = Table(title="latency (ms): p50 / p90 / p99", title_justify="left")
    for column in ("concurrency", "TTFT", "ITL", "E2E"):
        latency.add_column(column, justify="right")
    for p in points:
        latency.add_row(
            _concurrency(p),
            *(
                f"{q.p50:,.2f} / {'-' if q.p90 is None else f'{q.p90:,.2f}'} / {q.p99:,.2f}"
                for q in (p.latency_ms["ttft"], p.latency_ms["itl"], p.latency_ms["e2e"])
            ),
        )
    return rates, latency


def chart(points: list[Point], num_prompts: int, title: str, path: Path) -> None:
    """bench.png: throughput and latency percentiles against concurrency."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = [p.concurrency or num_prompts for p in points]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    for metric in ("input", "output", "total"):
        left.plot(xs, [p.throughput[metric].total for p in points], marker="o", label=metric)
    left.set(xlabel="concurrency", ylabel="tokens/s", title="throughput")
    styles = {"p50": "-", "p90": "--", "p99": ":"}
    for metric, colour in (("ttft", "tab:blue"), ("itl", "tab:orange"), ("e2e", "tab:green")):
        for name, style in styles.items():
            ys = [getattr(p.latency_ms[metric], name) for p in points]
            if None in ys:  # a percentile the client does not write
                continue
            right.plot(
                xs,
                ys,
                color=colour,
                linestyle=style,
                marker="o",
                label=f"{metric.upper()} {name}",
            )
    right.set(xlabel="concurrency", ylabel="ms", title="latency")
    right.set_yscale("symlog", linthresh=0.1)  # ITL is far below TTFT and E2E
    for axis in (left, right):
        if len(xs) > 1 and max(xs) >= 8 * min(xs):
            axis.set_xscale("log", base=2)
        axis.legend(fontsize="small")
        axis.grid(True, alpha=0.3)
    fig.suptitle(title, fontsize="medium")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def bench(
    inventory: InventoryArg,
    workload_name: Annotated[
        str, typer.Option("--workload", help=f"one of {', '.join(WORKLOAD_NAMES)}")
    ] = "lmsys-2000-100",
    num_prompts: Annotated[
        int, typer.Option("--num-prompts", help="requests per run")
    ] = DEFAULT_NUM_PROMPTS,
    concurrency: Annotated[
        str | None,
        typer.Option(
            "--concurrency",
            help="at most C requests at once; a list (1,8,64) runs once per value "
            "(default: all requests at once)",
        ),
    ] = None,
    gpu_hour_price: Annotated[
        float, typer.Option("--gpu-hour-price", help="USD per GPU-hour, for the cost per 1M tokens")
    ] = DEFAULT_GPU_HOUR_USD,
    input_len: Annotated[
        int | None,
        typer.Option("--input-len", help="prompt tokens per request (--workload custom)"),
    ] = None,
    output_len: Annotated[
        int | None,
        typer.Option("--output-len", help="output tokens per request (--workload custom)"),
    ] = None,
    tokenizer: Annotated[
        str | None,
        typer.Option(
            "--tokenizer",
            help="the model's directory (on the client's machine), or a Hugging Face "
            "id in its local cache (default: the plan's model directory)",
        ),
    ] = None,
    client_place: Annotated[
        str,
        typer.Option(
            "--client",
            help="where the client runs: cluster (the engine's image on the "
            "endpoint's host, over SSH as Ansible connects) or controller (this machine)",
        ),
    ] = "cluster",
    client_python: Annotated[
        str | None,
        typer.Option(
            "--client-python",
            help="with --client controller: the Python that runs the engine's "
            "benchmark client (default: this one)",
        ),
    ] = None,
) -> None:
    """Run the engine's own benchmark client against the endpoint: throughput per node and
    per GPU, TTFT / ITL / E2E percentiles, cost per 1M tokens; JSON and a chart in the run
    record."""
    chosen = workload(workload_name, input_len, output_len)
    if not 1 <= num_prompts <= MAX_NUM_PROMPTS:
        raise ArgumentError(
            [f"--num-prompts {num_prompts}: expected a positive number, at most {MAX_NUM_PROMPTS}"]
        )
    if not 0 <= gpu_hour_price <= MAX_GPU_HOUR_USD:  # NaN and infinity fail too
        raise ArgumentError(
            [f"--gpu-hour-price {gpu_hour_price:g}: expected USD from 0 to {MAX_GPU_HOUR_USD:g}"]
        )
    levels = concurrency_list(concurrency)
    loaded = load_plan(inventory)
    plan = loaded.plan
    print_warnings(loaded.notices)
    client = client_for(plan)
    if client_place not in CLIENT_PLACES:
        raise ArgumentError(
            [f"--client {client_place!r}: expected one of {', '.join(CLIENT_PLACES)}"]
        )
    in_cluster = client_place == "cluster"
    if in_cluster and client_python:
        raise ArgumentError(
            [
                "--client-python goes with --client controller (in the cluster "
                "the engine image's own Python runs the client)"
            ]
        )
    python = client_python or sys.executable
    access = plan.access
    key = read_secret(access.api_key_file) if access.api_key_file else None
    ca = ca_text(access)
    where: InCluster | None = None
    local_env = client_process_env()
    if in_cluster:
        tok = tokenizer or str(plan.model_dir)
        where = in_cluster_target(inventory, plan)
    else:
        tok = resolve_tokenizer(plan, tokenizer)
        local_env = client_process_env(key, str(access.tls_ca_file) if ca else None)
        check_client(python, client, local_env)

    record = new_record_dir("bench", plan)
    started_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    if plan.lab:
        console.print(Text(f"note: {LAB_NOTICE}", "yellow"), soft_wrap=True)
    place = f"in {where.run.image} on {where.run.host}" if where is not None else "on this machine"
    console.print(
        f"bench {chosen.name} ({chosen.input_len} in / {chosen.output_len} out), "
        f"{num_prompts} prompts, {client.label} {place} against {plan.endpoint}; "
        f"record: {record}",
        soft_wrap=True,
    )
    scale = scale_of(plan)
    published = published_for(plan, chosen.name)
    points: list[Point] = []
    problems: list[str] = []
    for i, level in enumerate(levels, 1):
        tag = "all" if level is None else str(level)
        out_dir = record / f"concurrency-{tag}"
        out_dir.mkdir()
        spec = RunSpec(
            plan.endpoint, plan.served_model_name, tok, chosen, num_prompts, level, out_dir
        )
        argv = (
            cluster_argv(client, spec) if where is not None else client_argv(client, python, spec)
        )
        label = f"concurrency {tag} ({i}/{len(levels)})"
        log = out_dir / "client.log"
        try:
            if where is not None:
                rc = run_in_cluster(where, client, spec, key, ca, out_dir, label)
            else:
                rc = run_client(argv, log, label, local_env)
        except Interrupted as stop:
            summary = {
                "status": "cancelled",
                "cancelled": signal_name(stop.signum),
                "rc": exit_code(stop.signum),
                "done": [_concurrency(p) for p in points],
                "started_at": started_at,
            }
            (record / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
            err_console.print(
                f"bench cancelled ({signal_name(stop.signum)}) during {label}; "
                f"the client was stopped; record: {record}",
                soft_wrap=True,
            )
            raise
        result_file = out_dir / client.result_name
        if rc != 0 or not result_file.exists():
            problems.append(
                f"{label}: the client exited {rc}"
                + ("" if result_file.exists() else " without a result file")
            )
            err_console.print(
                Text(f"{label}: the client failed; its last lines ({log}):", "bold red")
            )
            for line in _tail(log):
                err_console.print(f"  {line}", markup=False, highlight=False, soft_wrap=True)
            break
        text = result_file.read_text()
        result_file.write_text(sanitized(client.result_format, text))
        result = parse_result(client.result_format, text, num_prompts, str(result_file))
        points.append(point(result, level, scale, gpu_hour_price, published, argv))
        if result.failed:
            problems.append(
                f"{label}: {result.failed} of {num_prompts} requests failed (client log: {log})"
            )

    doc = document(
        plan=plan,
        inventory=inventory,
        client=client,
        workload=chosen,
        num_prompts=num_prompts,
        gpu_hour_usd=gpu_hour_price,
        points=points,
        record=record,
        started_at=started_at,
        ok=not problems,
        problems=problems,
    )
    (record / "bench.json").write_text(json.dumps(doc, indent=2) + "\n")
    code = EXIT_OK if not problems else EXIT_FAILED
    summary = {
        "status": "successful" if code == EXIT_OK else "failed",
        "rc": code,
        "problems": problems,
        "started_at": started_at,
    }
    (record / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    if points:
        title = (
            f"{plan.engine} {plan.layout}, {scale.nodes} nodes / {scale.gpus} GPUs, "
            f"{chosen.name}, {num_prompts} prompts" + (" (lab: meaningless)" if plan.lab else "")
        )
        chart(points, num_prompts, title, record / "bench.png")
        for table in tables(points):
            console.print(table)
        for p in published:
            console.print(f"published: {p.source}", soft_wrap=True)
        console.print(
            f"cost: {scale.gpus} GPUs x ${gpu_hour_price:g}/GPU-hour, the whole "
            "cluster's time charged to each kind of token",
            soft_wrap=True,
        )
    if plan.lab:
        console.print(Text(f"note: {LAB_NOTICE}", "yellow"), soft_wrap=True)
    for line in problems:
        console.print(Text.assemble(("problem: ", "bold red"), line), soft_wrap=True)
    verdict = Text("ok", "green") if code == EXIT_OK else Text("failed", "red")
    console.print(Text.assemble("bench ", verdict, f"; record: {record}"))
    raise typer.Exit(code)


def register(app: typer.Typer) -> None:
    """Add `bench` to the app."""
    app.command("bench")(bench)
