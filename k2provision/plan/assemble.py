"""Cluster + model + hardware -> Plan: parallel layout, ranks, memory fit, rendered launches.

Pure: no I/O beyond reading a k2_model_config_json and the endpoint's key and TLS files (judged
by core/access_files.py; the plan holds their paths, never their contents). `build_plan`
refuses a cluster that cannot serve the model, naming the numbers and only fixes that work
(plan/fixes.py): every suggested change (node counts, layouts, redundant experts, GPUs per node,
KV dtype, context) is planned again and offered only when that plan fits. A pool may hold
several equal instances (a fleet, k2_instances and its PD forms): shapes and fits are per
instance, and each instance is planned with its own hosts, master and URL (`pool_plan`) for the
engine to render behind one router.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from urllib.parse import urlsplit

from k2provision.core import catalog
from k2provision.core.access_files import access_file_problems
from k2provision.core.endpoint_guard import TLS_CA, guard_path
from k2provision.core.firewall import MESH_PORT_SETTING
from k2provision.core.records import (
    AccessFiles,
    CanarySettings,
    Cluster,
    ContainerOptions,
    FleetSettings,
    HostPlan,
    ModelSpec,
    Plan,
    PoolName,
    PoolPlan,
    Process,
    WeightsInfo,
)
from k2provision.core.templating import (
    host_values_path,
    host_values_script,
    launch_script,
    registrar_path,
    registrar_script,
)
from k2provision.core.variables import INSTANCE_VARS as INSTANCE_VARIABLES
from k2provision.engines import REGISTRY, layout_of
from k2provision.engines.base import Deployment, HostRender, Listener
from k2provision.engines.common import any_address, multi_host, socket_warnings
from k2provision.engines.sglang import ROUTER_LIVENESS_PATH, ROUTER_REQUEST_TIMEOUT_S
from k2provision.errors import InventoryError, K2Error, PlanError
from k2provision.plan.caches import compile_cache_dir, with_compile_caches
from k2provision.plan.containers import spec_hash
from k2provision.plan.fit import edge_warnings
from k2provision.plan.fixes import fixes
from k2provision.plan.front import front_plan, router_refs
from k2provision.plan.images import engine_image, image_sources, router_image
from k2provision.plan.ports import host_ports, port_clashes
from k2provision.plan.shapes import PoolShape, choices, evaluate, nodes_text, pool_names
from k2provision.plan.support import engine_setting_problems, model_problems, resolve_model

# The port setting of the ssh mesh: an engine whose render binds it serves the mesh.


def build_plan(cluster: Cluster, spec: ModelSpec | None = None) -> Plan:
    """Decide everything about a deployment; raise PlanError when it cannot work."""
    # The settings and the model's problems are reported together: every problem at once.
    settings = [*engine_setting_problems(cluster), *access_file_problems(cluster)]
    if spec is None:
        try:
            spec = resolve_model(cluster)
        except K2Error as error:
            raise InventoryError([*settings, *error.problems]) from None
    gpu = catalog.gpu(cluster.gpu)
    engine = REGISTRY[cluster.engine]
    release = engine.RELEASE
    context = cluster.context_length or spec.max_position_embeddings
    problems, found = model_problems(cluster, spec, gpu, context)
    if settings:
        raise InventoryError([*settings, *problems])
    if problems:
        raise PlanError(problems)
    # The gates the inventory switches off first, loudly; then what it sets to no effect.
    warnings = [*cluster.switched_off, *cluster.notes, *found]

    if problem := fleet_problem(cluster):
        raise PlanError([problem])
    layout = layout_of(cluster)
    names = pool_names(layout)
    # Shapes and fits are per instance: every instance of a pool is alike.
    counts: dict[PoolName, int] = {
        p: len(cluster.pool(p)) // cluster.instance_count(p) for p in names
    }
    shapes, reports, pool_problems = evaluate(cluster, counts, spec, gpu, context)
    if pool_problems:
        suggestions = fixes(cluster, counts, spec, gpu, context)
        for pool_name, found in pool_problems.items():
            count = counts[pool_name]
            hints = suggestions.get(pool_name, [])
            per = " (per instance)" if cluster.instance_count(pool_name) > 1 else ""
            fix = (
                f"; fix{per}: " + ", or ".join(hints)
                if hints
                else (
                    f"; no change near this {cluster.engine} layout fits {gpu.key} GPUs; "
                    "fix: choose larger GPUs or another engine"
                )
            )
            for problem in found:
                each = " per instance" if cluster.instance_count(pool_name) > 1 else ""
                problems.append(
                    f"[{pool_name}] ({nodes_text(count)}{each} x {cluster.gpus_per_node} "
                    f"{gpu.key}): {problem}{fix}"
                )
        raise PlanError(problems)

    c = choices(cluster, spec, gpu)
    warnings += [
        f"[{r.pool}] fits only {r.kv_tokens_per_replica} KV tokens per attention group, fewer "
        f"than 2 x k2_context_length ({context}): expect few concurrent long requests"
        for r in reports
        if r.kv_tokens_per_replica < 2 * context
    ]
    warnings += edge_warnings(reports)
    warnings += socket_warnings(cluster)
    routed = layout.disaggregated or cluster.fleet
    warnings += engine.plan_warnings(cluster, spec, release)

    pools = tuple(
        pool_plan(cluster, shape, report.mem_fraction)
        for shape, report in zip(shapes, reports, strict=True)
    )
    image = engine_image(cluster, release)
    deployment = Deployment(
        cluster=cluster,
        model=spec,
        release=release,
        pools=pools,
        context_length=context,
        image=image,
        router_image=router_image(cluster, image),
        kv_cache_dtype=c.kv_dtype,
        multimodal=c.multimodal,
        language_model_only=c.language_model_only,
    )
    rendered = with_front_listeners(
        cluster, with_compile_caches(cluster, engine.render(deployment))
    )
    listeners = {name: out.listeners for name, out in rendered.items()}
    endpoint = engine.endpoint(deployment)
    endpoint_host = (
        cluster.router_hosts[0]
        if cluster.front
        else next(
            (h.name for h in cluster.hosts if h.address.lower() == urlsplit(endpoint).hostname),
            pools[0].master,
        )
    )
    routers = router_refs(cluster, endpoint, endpoint_host, routed)
    if clashes := port_clashes(cluster, listeners, endpoint_host):
        raise InventoryError(clashes)
    host_plans = []
    for h in cluster.hosts:
        out = rendered.get(h.name)
        pool = next((i for p in pools for i in p.members() if h.name in i.hosts), None)
        files = dict(out.files) if out else {}
        processes = out.processes if out else ()
        if cluster.lab and h.lab_fault:
            processes = tuple(p.model_copy(update={"lab_fault": h.lab_fault}) for p in processes)
        config_dir = cluster.tunables.config_dir
        for proc in processes:
            files[f"{config_dir}/launch/{proc.name}.sh"] = launch_script(proc, config_dir)
            if proc.resolve:
                files[host_values_path(config_dir)] = host_values_script()
            if proc.registrar is not None:
                files[registrar_path(config_dir)] = registrar_script()
        host_plans.append(
            HostPlan(
                name=h.name,
                address=h.address,
                local_ip=h.local_ip,
                ib_devices=h.ib_devices,
                role="router" if h.pool == "router" else ("node" if h.pool == "nodes" else h.pool),
                pool=h.pool,
                node_rank=pool.hosts.index(h.name) if pool else 0,
                # A spare is a GPU host like the others (its GPUs checked, its exporters
                # scraped), serving nothing until heal puts it in a failed host's place.
                gpus=0
                if pool is None and h.pool != "spare"
                else (1 if engine.SINGLE_GPU else cluster.gpus_per_node),
                processes=processes,
                files=files,
                ports=host_ports(out.listeners if out else ()),
                instance=pool.instance if pool else "",
            )
        )
    container = container_options(cluster, deployment)
    host_plans = with_instance_specs(host_plans, pools, container)
    drained = drained_instances(cluster, pools)
    return Plan(
        engine=cluster.engine,
        engine_version=release.version,
        engine_min_driver=release.min_driver,
        layout=cluster.layout,
        model=spec.id,
        model_dir=cluster.model_dir,
        gpu=gpu.key,
        endpoint=endpoint,
        endpoint_host=endpoint_host,
        served_model_name=engine.served_name(cluster),
        config_dir=cluster.tunables.config_dir,
        ssh_port=cluster.tunables.ssh_port,
        mesh_served=any(
            binding.setting == MESH_PORT_SETTING for h in host_plans for binding in h.ports
        ),
        lab=cluster.lab,
        fleet=FleetSettings(
            max_unavailable=cluster.max_unavailable,
            drain_timeout=cluster.drain_timeout,
            canary=CanarySettings(
                percent=cluster.tunables.canary_percent,
                hold_s=cluster.tunables.canary_hold_s,
                max_error_pct=cluster.tunables.canary_max_error_pct,
                max_latency_ratio=cluster.tunables.canary_max_latency_ratio,
            ),
            drained=tuple(i.instance for i in drained),
            drained_hosts=tuple(h for i in drained for h in i.hosts),
            drained_named=cluster.drained,
            replaced=dict(cluster.replaced),
            spares=tuple(h.name for h in cluster.hosts if h.pool == "spare"),
        ),
        access=access_files(cluster),
        container=container,
        pools=pools,
        fit=tuple(reports),
        weights=WeightsInfo(
            checkpoint_gib=spec.checkpoint_gib,
            shard_count=spec.shard_count,
            allow_patterns=spec.allow_patterns,
        ),
        warnings=tuple(warnings),
        hosts=tuple(host_plans),
        images=image_sources(host_plans, release),
        routers=routers,
        front=front_plan(cluster, routers, ROUTER_LIVENESS_PATH, ROUTER_REQUEST_TIMEOUT_S),
    )


def drained_instances(cluster: Cluster, pools: tuple[PoolPlan, ...]) -> tuple[PoolPlan, ...]:
    """The fleet instances holding a drained host (Cluster.drained), in the plan's order;
    PlanError for a drained host that serves in no instance of a pool of several (a router
    or monitoring host, a single instance: `k2provision stop` is what stops those)."""
    members = [i for pool in pools for i in pool.instances]
    problems = [
        f"{host}: drained, but it serves in no instance of a fleet's pool; expected a host "
        f"of an instance of k2_instances > 1; fix: k2provision return "
        f"{cluster.inventory} {host} (k2provision stop stops a single instance)"
        for host in cluster.drained
        if not any(host in i.hosts for i in members)
    ]
    if problems:
        raise PlanError(problems)
    return tuple(i for i in members if set(i.hosts) & set(cluster.drained))


def with_front_listeners(
    cluster: Cluster, rendered: dict[str, HostRender]
) -> dict[str, HostRender]:
    """Each front host's HAProxy on the endpoint's port (every address, the one public port
    there), beside what the engine renders for the host: the plan checks it against the
    host's other ports and the firewall opens it. A host daemon of role k2_front_tier, in no
    container."""
    if not cluster.front:
        return rendered
    out = dict(rendered)
    for name in cluster.router_hosts:
        before = out.get(name, HostRender())
        haproxy = Listener(
            setting="k2_api_port",
            what="the front's HAProxy",
            port=cluster.tunables.api_port,
            process="haproxy",
            container="",
            bind=any_address(cluster),
            public=True,
        )
        out[name] = before.model_copy(update={"listeners": (*before.listeners, haproxy)})
    return out


def instance_ranks(
    hosts: Sequence[HostPlan], instance: PoolPlan
) -> list[tuple[HostPlan, int, Process]]:
    """(host, index in its processes, process) of each engine rank of a pool instance: the
    GPU processes on its hosts that serve it (a fleet's name it; a single instance owns every
    GPU process of its hosts). The router holds no GPU."""
    return [
        (host, n, p)
        for host in hosts
        if host.name in instance.hosts
        for n, p in enumerate(host.processes)
        if p.gpus and (p.instance is None or p.instance.name == instance.instance)
    ]


def with_instance_specs(
    hosts: list[HostPlan], pools: Sequence[PoolPlan], container: ContainerOptions
) -> list[HostPlan]:
    """Every rank of an instance on several hosts carries the digest of all its ranks' specs
    (Process.instance_spec), so the spec hash each container is compared by covers the whole
    instance: a change to one rank replaces every rank (a lone new rank would wait for a
    group the others left)."""
    specs: dict[tuple[str, int], str] = {}
    for pool in pools:
        for instance in pool.members():
            if len(instance.hosts) < 2:
                continue
            ranks = instance_ranks(hosts, instance)
            doc = sorted((h.name, n, spec_hash(container, p, dict(h.files))) for h, n, p in ranks)
            digest = hashlib.sha256(json.dumps(doc).encode()).hexdigest()[:16]
            specs.update({(h.name, n): digest for h, n, _ in ranks})
    return [
        host.model_copy(
            update={
                "processes": tuple(
                    p.model_copy(update={"instance_spec": specs[(host.name, n)]})
                    if (host.name, n) in specs
                    else p
                    for n, p in enumerate(host.processes)
                )
            }
        )
        for host in hosts
    ]


def access_files(cluster: Cluster) -> AccessFiles:
    """The endpoint's key and TLS files, where the inventory names them and where the CA
    lands on the endpoint's host."""
    t = cluster.tunables
    return AccessFiles(
        api_key_file=t.api_key_file,
        tls_cert_file=t.tls_cert_file,
        tls_key_file=t.tls_key_file,
        tls_ca_file=t.tls_ca_file,
        host_ca_file=guard_path(t.config_dir, TLS_CA) if t.tls_ca_file else None,
    )


# Instances are named after their pool: replica-1, prefill-2, decode-3.
INSTANCE_LABELS: dict[PoolName, str] = {
    "nodes": "replica",
    "prefill": "prefill",
    "decode": "decode",
}


def pool_plan(cluster: Cluster, shape: PoolShape, mem_fraction: float) -> PoolPlan:
    """A pool and, when it holds several, its instances: its hosts in inventory order, split
    into equal consecutive groups, each named, with its own master and URL."""
    hosts = cluster.pool(shape.name)
    count = cluster.instance_count(shape.name)
    size = len(hosts) // count
    sizes = {"name": shape.name, "gpus": shape.gpus, "parallel": shape.parallel}
    instances: list[PoolPlan] = []
    # In a fleet every pool's instances are named (a pool of one too), so the router's
    # workers and each container's spec say which instance they are; a single-instance
    # inventory plans as it always has.
    for i in range(count if cluster.fleet else 0):
        group = hosts[i * size : (i + 1) * size]
        instance = PoolPlan(
            **sizes,
            hosts=tuple(h.name for h in group),
            master=group[0].name,
            master_address=group[0].address,
            mem_fraction=mem_fraction,
            instance=f"{INSTANCE_LABELS[shape.name]}-{i + 1}",
        )
        engine = REGISTRY[cluster.engine]
        instance = instance.model_copy(update={"url": engine.instance_url(cluster, instance)})
        worker = engine.router_worker(cluster, instance)
        instances.append(instance.model_copy(update={"router_worker": worker}))
    return PoolPlan(
        **sizes,
        hosts=tuple(h.name for h in hosts),
        master=hosts[0].name,
        master_address=hosts[0].address,
        mem_fraction=mem_fraction,
        instances=tuple(instances),
    )


def fleet_problem(cluster: Cluster) -> str | None:
    """Why the engine cannot render the fleet the inventory asks for (None when it can or
    when no pool holds more than one instance)."""
    engine = REGISTRY[cluster.engine]
    if not cluster.fleet or cluster.layout in engine.FLEET_LAYOUTS:
        return None
    counts = ", ".join(
        f"{INSTANCE_VARIABLES[p]}={cluster.instance_count(p)}"
        for p in pool_names(layout_of(cluster))
        if cluster.instance_count(p) > 1
    )
    working = "; ".join(
        f"{e.DISPLAY_NAME} {', '.join(e.FLEET_LAYOUTS)}"
        for e in REGISTRY.values()
        if e.FLEET_LAYOUTS
    )
    return (
        f"{counts}: {engine.DISPLAY_NAME} layout {cluster.layout} renders one instance per "
        f"inventory (each host of its pools in one group); fleets of several instances behind "
        f"one router render for: {working}; fix: set {counts.split('=')[0]}=1 (one "
        "inventory per instance), or choose a layout that renders fleets"
    )


def container_options(cluster: Cluster, deployment: Deployment) -> ContainerOptions:
    """docker run options: exactly what the engine needs on this cluster, each with its reason
    (docs/engines.md, "Container privileges"), or the lab profile on hosts without hardware."""
    config_dir = cluster.tunables.config_dir
    cache = compile_cache_dir(cluster)
    volumes = (f"{cluster.model_dir}:{cluster.model_dir}:ro", f"{config_dir}:{config_dir}:ro")
    reasons = {
        "--network host": "engines bind and dial the hosts' own addresses; RDMA connection "
        "setup and RoCE GIDs live in the host's network namespace",
        "--ipc host": "CUDA IPC between the rank processes of a node and NCCL's shared-memory "
        "transport use the host's /dev/shm (Docker's 64 MiB one makes NCCL fail at init)",
        f"--volume {volumes[0]}": "the weights, read-only, at the path the plan names",
        f"--volume {volumes[1]}": "launch scripts and config files, read-only",
        f"--volume {cache}:{cache}": "(GPU containers) the engine's compile and JIT caches "
        "(k2_compile_cache_dir), so a restart or a rolling change reuses the kernels the last "
        "start compiled",
    }
    if cluster.lab:
        # Lab hosts have no GPUs or InfiniBand, and cannot grant unlimited memlock.
        return ContainerOptions(
            gpus=None,
            privileged=False,
            cap_add=(),
            devices=(),
            ulimits=("nofile=20000:20000", "nproc=4096:4096"),
            volumes=volumes,
            compile_cache=cache,
            reasons={
                **reasons,
                "--ulimit nofile=20000:20000": "the lab host's own limit (no GPUs, no RDMA)",
                "--ulimit nproc=4096:4096": "bounds a runaway stand-in on a shared machine",
            },
        )
    reasons["--gpus all"] = "the node's GPUs (NVIDIA container toolkit)"
    caps: list[str] = []
    devices: list[str] = []
    ulimits = ["nofile=1048576:1048576"]
    reasons["--ulimit nofile=1048576:1048576"] = (
        "sockets per peer rank and per client (ZMQ, HTTP, NCCL); 1024 runs out at scale"
    )
    if multi_host(cluster):  # RDMA between hosts
        devices.append("/dev/infiniband")
        reasons["--device /dev/infiniband"] = (
            "RDMA verbs and connection manager: NCCL's IB transport, DeepEP (NVSHMEM IBGDA) "
            "and Mooncake's KV transfer; GPUDirect RDMA itself needs only nvidia-peermem (or "
            "DMA-BUF) on the host, and IBGDA the driver options the prepare phase sets"
        )
        caps.append("IPC_LOCK")
        reasons["--cap-add IPC_LOCK"] = "registering (pinning) RDMA buffers of many GB"
        ulimits.insert(0, "memlock=-1:-1")
        reasons["--ulimit memlock=-1:-1"] = "the RDMA registrations are not bounded by memlock"
    needs = REGISTRY[cluster.engine].CONTAINER_NEEDS
    for cap, why in needs.cap_add:
        caps.append(cap)
        reasons[f"--cap-add {cap}"] = why
    for ulimit, why in needs.ulimits:
        ulimits.insert(len(ulimits) - 1, ulimit)
        reasons[f"--ulimit {ulimit}"] = why
    return ContainerOptions(
        privileged=False,
        cap_add=tuple(caps),
        ulimits=tuple(ulimits),
        devices=tuple(devices),
        volumes=volumes,
        compile_cache=cache,
        reasons=reasons,
    )


def plan_digest(plan: Plan) -> str:
    """A stable sha256 of the plan's content: equal plans, equal digests."""
    return hashlib.sha256(plan.model_dump_json().encode()).hexdigest()
