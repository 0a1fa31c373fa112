"""Cluster + model + hardware -> Plan: parallel layout, ranks, memory fit, rendered launches.

Pure: no I/O. `build_plan` refuses a cluster that cannot serve the model, naming the numbers
and the smallest layout of the same kind that would.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from k2provision import catalog
from k2provision.catalog import GIB
from k2provision.engines import REGISTRY
from k2provision.engines.base import Deployment
from k2provision.errors import PlanError
from k2provision.models import (
    Cluster,
    ContainerOptions,
    FitReport,
    GpuSpec,
    HostPlan,
    ModelSpec,
    Parallel,
    Plan,
    PoolName,
    PoolPlan,
)
from k2provision.render import launch_script

# Fraction of GPU memory each engine may use for weights + KV cache, per pool.
MEM_FRACTION: dict[tuple[str, PoolName], float] = {
    ("sglang", "nodes"): 0.85,
    ("sglang", "prefill"): 0.85,
    ("sglang", "decode"): 0.80,
    ("vllm", "nodes"): 0.85,
    ("trtllm", "nodes"): 0.90,
    ("ktransformers", "nodes"): 0.90,
}

LAB_IMAGE = "localhost/k2-standin:lab"
MAX_SEARCH_NODES = 64


@dataclass(frozen=True)
class PoolShape:
    """The parallel shape of one pool before host names are attached."""

    name: PoolName
    nodes: int
    gpus: int
    parallel: Parallel


def _shape_sglang_tp(nodes: int, gpn: int) -> Parallel:
    return Parallel(tp=nodes * gpn)


def _shape_dp_attention_ep(nodes: int, gpn: int, redundant: int = 0) -> Parallel:
    n = nodes * gpn
    return Parallel(tp=n, dp=n, ep=n, dp_attention=True, redundant_experts=redundant)


def _shape_vllm_tp_pp(nodes: int, gpn: int) -> Parallel:
    return Parallel(tp=gpn, pp=nodes)


def _shape_vllm_dp_ep(nodes: int, gpn: int) -> Parallel:
    return Parallel(tp=1, dp=nodes * gpn, ep=nodes * gpn)


def _shape_trtllm(nodes: int, gpn: int) -> Parallel:
    return Parallel(tp=nodes * gpn, dp=nodes * gpn, ep=gpn, dp_attention=True)


def _shape_single(nodes: int, gpn: int) -> Parallel:
    return Parallel(tp=1)


SHAPES: dict[tuple[str, str], Callable[[int, int], Parallel]] = {
    ("sglang", "tp"): _shape_sglang_tp,
    ("vllm", "tp"): _shape_sglang_tp,
    ("vllm", "tp_pp"): _shape_vllm_tp_pp,
    ("vllm", "dp_ep"): _shape_vllm_dp_ep,
    ("trtllm", "tp_ep"): _shape_trtllm,
    ("ktransformers", "single"): _shape_single,
}


def pool_shapes(cluster: Cluster, counts: dict[PoolName, int]) -> list[PoolShape]:
    """Parallel shapes for a layout given how many nodes each pool has."""
    gpn = cluster.gpus_per_node
    shapes = []
    for name, nodes in counts.items():
        if cluster.layout == "pd":
            redundant: int | None = 0
            if name == "decode":
                # One spare expert slot per decode GPU unless the inventory says otherwise.
                redundant = cluster.tunables.decode_redundant_experts
                if redundant is None:
                    redundant = nodes * gpn
            parallel = _shape_dp_attention_ep(nodes, gpn, redundant or 0)
        else:
            parallel = SHAPES[(cluster.engine, cluster.layout)](nodes, gpn)
        gpus = 1 if cluster.engine == "ktransformers" else nodes * gpn
        shapes.append(PoolShape(name=name, nodes=nodes, gpus=gpus, parallel=parallel))
    return shapes


def divisibility_problems(shape: PoolShape, spec: ModelSpec) -> list[str]:
    """Sizes that the model's dimensions do not allow."""
    p = shape.parallel
    problems = []
    if spec.num_attention_heads % p.attention_tp:
        problems.append(
            f"attention tensor parallel size {p.attention_tp} does not divide the model's "
            f"{spec.num_attention_heads} attention heads"
        )
    if p.ep > 1 and (spec.n_routed_experts + p.redundant_experts) % p.ep:
        problems.append(
            f"expert parallel size {p.ep} does not divide {spec.n_routed_experts} experts"
            + (f" + {p.redundant_experts} redundant" if p.redundant_experts else "")
        )
    if p.pp > spec.num_hidden_layers:
        problems.append(f"pipeline size {p.pp} exceeds the model's {spec.num_hidden_layers} layers")
    if p.pp > 1 and p.tp * p.pp != shape.gpus:
        problems.append(f"tp {p.tp} x pp {p.pp} does not use the pool's {shape.gpus} GPUs")
    return problems


def fit(
    shape: PoolShape,
    spec: ModelSpec,
    gpu: GpuSpec,
    *,
    mem_fraction: float,
    context_length: int,
    reserve_gib: float,
    engine: str,
) -> FitReport:
    """Memory arithmetic per GPU: weights + reserve + KV cache for `context_length` tokens."""
    p = shape.parallel
    gpu_gib = gpu.memory_mib / 1024
    budget = gpu_gib * mem_fraction
    if engine == "ktransformers":
        weights = catalog.dense_bytes(spec) / GIB  # routed experts live in host memory
    else:
        expert_shards = max(p.tp, p.ep) * p.pp
        redundant_per_gpu = p.redundant_experts / p.ep if p.ep > 1 else 0.0
        weights = (
            catalog.routed_expert_bytes(spec) / expert_shards
            + redundant_per_gpu * catalog.one_expert_all_layers_bytes(spec)
            + catalog.dense_bytes(spec) / (p.attention_tp * p.pp)
        ) / GIB
    kv_gib = max(budget - weights - reserve_gib, 0.0)
    layers_per_gpu = -(-spec.num_hidden_layers // p.pp)
    kv_per_token = catalog.kv_bytes_per_token_per_layer(spec) * layers_per_gpu
    tokens_per_gpu = int(kv_gib * GIB // kv_per_token)
    replicas = max(shape.gpus // (p.attention_tp * p.pp), 1)
    return FitReport(
        pool=shape.name,
        gpu_memory_gib=round(gpu_gib, 1),
        budget_gib=round(budget, 1),
        weights_gib=round(weights, 1),
        reserve_gib=reserve_gib,
        kv_gib=round(kv_gib, 1),
        kv_bytes_per_token=kv_per_token,
        kv_tokens_per_gpu=tokens_per_gpu,
        kv_tokens_total=tokens_per_gpu * replicas,
        context_length=context_length,
        fits=tokens_per_gpu >= context_length,
    )


def _evaluate(
    cluster: Cluster, counts: dict[PoolName, int], spec: ModelSpec, gpu: GpuSpec, context: int
) -> tuple[list[PoolShape], list[FitReport], dict[PoolName, list[str]]]:
    shapes = pool_shapes(cluster, counts)
    reports = []
    problems: dict[PoolName, list[str]] = {}
    for shape in shapes:
        report = fit(
            shape,
            spec,
            gpu,
            mem_fraction=MEM_FRACTION[(cluster.engine, shape.name)],
            context_length=context,
            reserve_gib=cluster.tunables.reserve_gib,
            engine=cluster.engine,
        )
        reports.append(report)
        found = divisibility_problems(shape, spec)
        if not report.fits:
            found.append(
                f"{report.weights_gib} GiB of weights + {report.reserve_gib} GiB reserve per GPU "
                f"leave {report.kv_gib} GiB of a {report.budget_gib} GiB budget "
                f"({MEM_FRACTION[(cluster.engine, shape.name)]} x {report.gpu_memory_gib} GiB): "
                f"KV cache for {report.kv_tokens_per_gpu} tokens, {context} needed"
            )
        if found:
            problems[shape.name] = found
    return shapes, reports, problems


def _smallest_fit(
    cluster: Cluster,
    pool: PoolName,
    counts: dict[PoolName, int],
    *,
    spec: ModelSpec,
    gpu: GpuSpec,
    context: int,
) -> str:
    """Describe the smallest node count for `pool` that would fit, all else equal."""
    for n in range(1, MAX_SEARCH_NODES + 1):
        trial = {**counts, pool: n}
        shapes, _, problems = _evaluate(cluster, trial, spec, gpu, context)
        if pool not in problems:
            shape = next(s for s in shapes if s.name == pool)
            p = shape.parallel
            sizes = (
                f"tp {p.tp}"
                + (f", pp {p.pp}" if p.pp > 1 else "")
                + (f", dp {p.dp}, ep {p.ep}" if p.ep > 1 else "")
            )
            return (
                f"the smallest {cluster.engine} {cluster.layout} [{pool}] that fits is "
                f"{n} node{'s' if n > 1 else ''} x {cluster.gpus_per_node} {gpu.key} ({sizes})"
            )
    return f"no [{pool}] of up to {MAX_SEARCH_NODES} nodes of {gpu.key} fits"


def build_plan(cluster: Cluster, spec: ModelSpec | None = None) -> Plan:
    """Decide everything about a deployment; raise PlanError when it cannot work."""
    if spec is None:
        spec = catalog.model(cluster.model)
        if cluster.tunables.model_config_json:
            spec = catalog.model_from_config(spec, Path(cluster.tunables.model_config_json))
    gpu = catalog.gpu(cluster.gpu)
    release = catalog.RELEASES[cluster.engine]
    context = cluster.context_length or spec.max_position_embeddings
    problems: list[str] = []
    if not gpu.fp8:
        problems.append(
            f"k2_gpu={gpu.key}: {spec.id} ships FP8 weights, which {gpu.key} cannot run natively; "
            "fix: use Hopper or Blackwell GPUs (h200, h100, h20, h800, b200)"
        )
    if context > spec.max_position_embeddings:
        problems.append(
            f"k2_context_length={context} exceeds {spec.id}'s max_position_embeddings "
            f"{spec.max_position_embeddings}; fix: lower k2_context_length"
        )
    if problems:
        raise PlanError(problems)

    pool_names: list[PoolName] = ["prefill", "decode"] if cluster.layout == "pd" else ["nodes"]
    counts: dict[PoolName, int] = {p: len(cluster.pool(p)) for p in pool_names}
    shapes, reports, pool_problems = _evaluate(cluster, counts, spec, gpu, context)
    for pool_name, found in pool_problems.items():
        count = counts[pool_name]
        suggestion = _smallest_fit(cluster, pool_name, counts, spec=spec, gpu=gpu, context=context)
        for problem in found:
            problems.append(
                f"[{pool_name}] ({count} node{'s' if count > 1 else ''} x {cluster.gpus_per_node} "
                f"{gpu.key}): {problem}; fix: {suggestion}, or lower k2_context_length"
            )
    if problems:
        raise PlanError(problems)

    warnings = [
        f"[{r.pool}] fits only {r.kv_tokens_per_gpu} KV tokens per attention group, fewer than "
        f"2 x k2_context_length ({context}): expect few concurrent long requests"
        for r in reports
        if r.kv_tokens_per_gpu < 2 * context
    ]
    if cluster.engine == "vllm" and len(cluster.hosts) > 1 and not cluster.tunables.socket_ifname:
        warnings.append(
            "k2_socket_ifname is unset: multi-node vLLM lets GLOO and NCCL pick a socket "
            "interface, a common cause of hangs at start; set it to the cluster network's "
            "interface (e.g. k2_socket_ifname=bond0)"
        )
    if cluster.engine == "trtllm" and not cluster.tunables.image and not cluster.lab:
        warnings.append(
            f"{release.image} has no sshd for mpirun's port-{cluster.tunables.ssh_port} mesh: "
            "build containers/trtllm from it and set k2_image to the result"
        )
    if cluster.engine == "ktransformers":
        warnings.append(
            f"ktransformers keeps routed experts in host memory: the host needs about "
            f"{catalog.routed_expert_bytes(spec) / GIB:.0f} GiB of RAM for FP8-sized experts "
            "(less with quantized GGUF experts); preflight checks it"
        )

    pools = tuple(
        PoolPlan(
            name=shape.name,
            hosts=tuple(h.name for h in cluster.pool(shape.name)),
            master=cluster.pool(shape.name)[0].name,
            master_address=cluster.pool(shape.name)[0].address,
            gpus=shape.gpus,
            parallel=shape.parallel,
            mem_fraction=MEM_FRACTION[(cluster.engine, shape.name)],
        )
        for shape in shapes
    )
    image = cluster.tunables.image or (LAB_IMAGE if cluster.lab else release.image)
    deployment = Deployment(
        cluster=cluster,
        model=spec,
        release=release,
        pools=pools,
        context_length=context,
        image=image,
    )
    renderer = REGISTRY[cluster.engine]
    rendered = renderer.render(deployment)
    endpoint = renderer.endpoint(deployment)
    host_plans = []
    for h in cluster.hosts:
        out = rendered.get(h.name)
        pool = next((p for p in pools if h.name in p.hosts), None)
        files = dict(out.files) if out else {}
        for proc in out.processes if out else ():
            files[f"{cluster.tunables.config_dir}/launch/{proc.name}.sh"] = launch_script(proc)
        host_plans.append(
            HostPlan(
                name=h.name,
                address=h.address,
                role="router" if h.pool == "router" else ("node" if h.pool == "nodes" else h.pool),
                pool=h.pool,
                node_rank=pool.hosts.index(h.name) if pool else 0,
                gpus=0
                if pool is None
                else (1 if cluster.engine == "ktransformers" else cluster.gpus_per_node),
                processes=out.processes if out else (),
                files=files,
            )
        )
    return Plan(
        engine=cluster.engine,
        engine_version=release.version,
        layout=cluster.layout,
        model=spec.id,
        model_dir=cluster.model_dir,
        gpu=gpu.key,
        endpoint=endpoint,
        endpoint_host=next(
            (h.name for h in cluster.hosts if f"//{h.address}:" in endpoint), pools[0].master
        ),
        # trtllm-serve has no served-model-name option: it lists the model by its path.
        served_model_name=cluster.model_dir
        if cluster.engine == "trtllm"
        else cluster.tunables.served_model_name,
        config_dir=cluster.tunables.config_dir,
        lab=cluster.lab,
        container=container_options(cluster, deployment),
        pools=pools,
        fit=tuple(reports),
        warnings=tuple(warnings),
        hosts=tuple(host_plans),
    )


def container_options(cluster: Cluster, deployment: Deployment) -> ContainerOptions:
    """docker run options: production values, or the lab profile on hosts without hardware."""
    config_dir = cluster.tunables.config_dir
    volumes = (f"{cluster.model_dir}:{cluster.model_dir}:ro", f"{config_dir}:{config_dir}:ro")
    if cluster.lab:
        # Lab hosts have no GPUs or InfiniBand, and cannot grant unlimited memlock.
        return ContainerOptions(
            gpus=None,
            privileged=False,
            cap_add=(),
            devices=(),
            ulimits=("nofile=20000:20000", "nproc=4096:4096"),
            volumes=volumes,
        )
    return ContainerOptions(privileged=cluster.engine == "trtllm", volumes=volumes)


def plan_digest(plan: Plan) -> str:
    """A stable sha256 of the plan's content: equal plans, equal digests."""
    return hashlib.sha256(plan.model_dump_json().encode()).hexdigest()
