"""The catalog as a table: every model's size, format and context, which pinned engine
releases serve it, and per GPU type the fewest nodes each engine layout needs. Pure."""

from __future__ import annotations

from typing import Any

from rich.table import Table

from k2provision.core import catalog
from k2provision.core.records import Cluster, EngineName, ModelSpec, Tunables
from k2provision.core.versions import version_at_least
from k2provision.engines import REGISTRY, release
from k2provision.engines import support as engine_support
from k2provision.plan.fixes import search_limit, smallest_for_layout
from k2provision.plan.shapes import pool_names
from k2provision.plan.support import model_problems

GPUS_PER_NODE = 8


def support(spec: ModelSpec, engine: EngineName) -> str:
    """How the pinned release of `engine` stands with the model, in a few words."""
    s = engine_support(engine, spec.id)
    if s is None or s.min_version is None:
        return "no"
    if version_at_least(release(engine).version, s.min_version):
        return "yes"
    return f"needs >= {s.min_version}"


def _engine_row(spec: ModelSpec, engine: EngineName) -> dict[str, Any]:
    """The pinned release of `engine` and what it says of serving the model."""
    s = engine_support(engine, spec.id)
    return {
        "pinned": release(engine).version,
        "support": support(spec, engine),
        "min_version": s.min_version if s else None,
        "source": s.source if s else "",
    }


def _cluster(
    spec: ModelSpec, engine: EngineName, layout: str, gpu: str, context: int | None
) -> Cluster:
    return Cluster(
        inventory="(catalog)",
        engine=engine,
        layout=layout,
        model=spec.id,
        model_dir=f"/models/{spec.id.rsplit('/', 1)[-1]}",
        gpu=gpu,
        gpus_per_node=GPUS_PER_NODE,
        context_length=context,
        hosts=(),
        tunables=Tunables(),
    )


UNSERVED = "unsupported"


def smallest_nodes(spec: ModelSpec, gpu: str, context: int | None = None) -> dict[str, int | str]:
    """engine/layout -> the fewest nodes of `gpu` that serve one request of the context (the
    model's maximum unless given); UNSERVED where the pinned release cannot serve the model
    on this GPU or has no MoE kernel path for its weights in the layout, "over N" where no
    layout of up to N nodes fits."""
    gpu_spec = catalog.gpu(gpu)
    out: dict[str, int | str] = {}
    for engine, declared in REGISTRY.items():
        for layout in declared.LAYOUTS:
            key = f"{engine}/{layout.name}"
            cluster = _cluster(spec, engine, layout.name, gpu, context)
            ctx = context or spec.max_position_embeddings
            problems, _ = model_problems(cluster, spec, gpu_spec, ctx)
            problems += [
                p
                for pool in pool_names(layout)
                for p in declared.kernel_path_problems(cluster, pool, spec)
            ]
            if problems:
                out[key] = UNSERVED
                continue
            found = smallest_for_layout(cluster, layout, spec, gpu_spec, ctx, 10**9)
            limit = search_limit(layout)
            out[key] = sum(found[0].values()) if found else f"over {limit}"
    return out


def _cell(value: int | str) -> str:
    return "-" if value == UNSERVED else str(value)


def rows(gpus: tuple[str, ...] | None = None, context: int | None = None) -> list[dict[str, Any]]:
    """One dict per catalog model: its facts, engine support and smallest layouts per GPU."""
    keys = gpus or tuple(catalog.GPUS)
    out = []
    for spec in catalog.MODELS.values():
        out.append(
            {
                "model": spec.id,
                "checkpoint_gib": spec.checkpoint_gib,
                "shards": spec.shard_count,
                "quantization": spec.quantization.label,
                "context": spec.max_position_embeddings,
                "multimodal": spec.multimodal,
                "reasoning_parser": spec.reasoning_parser,
                "tool_parser": spec.tool_parser,
                "text_only_engines": [
                    e for e, declared in REGISTRY.items() if declared.TEXT_ONLY and spec.multimodal
                ],
                "engines": {engine: _engine_row(spec, engine) for engine in REGISTRY},
                "smallest_nodes": {gpu: smallest_nodes(spec, gpu, context) for gpu in keys},
            }
        )
    return out


def tables(data: list[dict[str, Any]]) -> list[Table]:
    """The rows as rich tables: the catalog, then one table of smallest layouts per GPU."""
    catalog_table = Table(title="Kimi-K2 family (catalog)", title_justify="left")
    catalog_table.add_column("model", no_wrap=True)
    for column in ("GiB", "shards", "weights", "context", "vision", "reasoning"):
        catalog_table.add_column(column)
    for engine in REGISTRY:
        catalog_table.add_column(f"{engine} {release(engine).version}")
    for row in data:
        catalog_table.add_row(
            row["model"],
            f"{row['checkpoint_gib']:g}",
            str(row["shards"]),
            row["quantization"],
            f"{row['context']:,}",
            "yes" if row["multimodal"] else "no",
            row["reasoning_parser"] or "-",
            *(row["engines"][engine]["support"] for engine in REGISTRY),
        )
    out = [catalog_table]
    layouts = [
        f"{e}/{layout.name}" for e, declared in REGISTRY.items() for layout in declared.LAYOUTS
    ]
    for gpu in data[0]["smallest_nodes"] if data else ():
        table = Table(
            title=f"fewest nodes of {GPUS_PER_NODE} x {gpu} for one request of the full "
            "context (-: the pinned release cannot serve it, or has no MoE kernel path for its "
            "weights in the layout)",
            title_justify="left",
        )
        table.add_column("model", no_wrap=True)
        for key in layouts:
            table.add_column(key)
        for row in data:
            nodes = row["smallest_nodes"][gpu]
            table.add_row(row["model"], *(_cell(nodes[k]) for k in layouts))
        out.append(table)
    return out


def markdown(data: list[dict[str, Any]]) -> str:
    """The rows as Markdown tables (the table in docs/models.md)."""
    lines = [
        "| model | GiB | shards | weights | context | vision | reasoning parser | "
        + " | ".join(f"{e} {release(e).version}" for e in REGISTRY)
        + " |",
        "|" + " --- |" * (7 + len(REGISTRY)),
    ]
    for row in data:
        lines.append(
            f"| `{row['model']}` | {row['checkpoint_gib']:g} | {row['shards']} | "
            f"{row['quantization']} | {row['context']:,} | "
            f"{'yes' if row['multimodal'] else 'no'} | {row['reasoning_parser'] or '-'} | "
            + " | ".join(row["engines"][e]["support"] for e in REGISTRY)
            + " |"
        )
    layouts = [
        f"{e}/{layout.name}" for e, declared in REGISTRY.items() for layout in declared.LAYOUTS
    ]
    for gpu in data[0]["smallest_nodes"] if data else ():
        lines += [
            "",
            f"Fewest nodes of {GPUS_PER_NODE} x {gpu} for one request of the full context "
            "(`-`: the pinned release cannot serve it, or has no MoE kernel path for its weights "
            "in the layout; `over N`: no layout of up to N nodes "
            "fits):",
            "",
            "| model | " + " | ".join(layouts) + " |",
            "|" + " --- |" * (1 + len(layouts)),
        ]
        for row in data:
            nodes = row["smallest_nodes"][gpu]
            lines.append(
                f"| `{row['model']}` | " + " | ".join(_cell(nodes[k]) for k in layouts) + " |"
            )
    return "\n".join(lines) + "\n"
