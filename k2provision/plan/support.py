"""Model and release checks: whether the pinned engine release serves the model, and what no
layout can fix (hardware formats, KV dtype, multimodal serving, context); and the inventory
settings the chosen engine cannot honour or never reads. Pure but for reading a
k2_model_config_json."""

from __future__ import annotations

from pathlib import Path

from k2provision.core import catalog
from k2provision.core.network import ip_version
from k2provision.core.records import Cluster, EngineName, EngineRelease, GpuSpec, ModelSpec
from k2provision.core.variables import TUNABLE_VARS, shorten_hosts, show
from k2provision.core.versions import version_at_least
from k2provision.engines import REGISTRY
from k2provision.engines import release as release_of
from k2provision.engines import support as engine_support
from k2provision.engines.base import layout_names
from k2provision.engines.common import unguarded_endpoint_problems


def resolve_model(cluster: Cluster) -> ModelSpec:
    """The catalog entry, with a local config.json's numbers when the inventory names one."""
    spec = catalog.model(cluster.model)
    if cluster.tunables.model_config_json:
        spec = catalog.model_from_config(spec, Path(cluster.tunables.model_config_json))
    return spec


def support_problems(
    spec: ModelSpec, engine: EngineName, release: EngineRelease, image: str | None
) -> tuple[list[str], list[str]]:
    """(problems, warnings) about whether the pinned engine release serves the model."""
    support = engine_support(engine, spec.id)
    others = [
        e
        for e in REGISTRY
        if e != engine
        and (s := engine_support(e, spec.id)) is not None
        and s.min_version is not None
        and version_at_least(release_of(e).version, s.min_version)
    ]
    alternatives = f"k2_engine={' or '.join(others)}" if others else "another model"
    if support is None or support.min_version is None:
        source = f" ({support.source})" if support else ""
        return (
            [
                f"k2_model={spec.id}: no {engine} release is known to serve it{source}; "
                f"fix: choose {alternatives}"
            ],
            [],
        )
    if version_at_least(release.version, support.min_version):
        return [], []
    if image:
        return [], [
            f"k2_image={image}: {spec.id} needs {engine} >= {support.min_version} "
            f"({support.source}) and the command lines follow {engine} {release.version}; "
            "make sure the image's release serves both"
        ]
    return (
        [
            f"k2_model={spec.id} needs {engine} >= {support.min_version} ({support.source}), "
            f"but the pinned release is {release.version}; fix: set k2_image to an image of "
            f"{engine} {support.min_version} or later, or choose {alternatives}"
        ],
        [],
    )


def model_problems(
    cluster: Cluster, spec: ModelSpec, gpu: GpuSpec, context: int
) -> tuple[list[str], list[str]]:
    """(problems, warnings) that no layout can fix: release, hardware formats, context."""
    release = release_of(cluster.engine)
    problems, warnings = support_problems(spec, cluster.engine, release, cluster.tunables.image)
    schemes = spec.quantization.schemes()
    if schemes & {"fp8_block", "fp8_channel"} and not gpu.fp8:
        problems.append(
            f"k2_gpu={gpu.key}: {spec.id} ships FP8 weights, which {gpu.key} cannot run "
            "natively; fix: use Hopper or Blackwell GPUs (h200, h100, h20, h800, b200)"
        )
    if schemes & {"nvfp4", "mxfp4"} and not gpu.fp4:
        problems.append(
            f"k2_gpu={gpu.key}: {spec.id} ships FP4 ({spec.quantization.label}) weights, which "
            f"{gpu.key} cannot run natively; fix: use Blackwell GPUs (b200)"
        )
    t = cluster.tunables
    engine = REGISTRY[cluster.engine]
    problems += engine.kv_dtype_problems(t, gpu)
    if t.multimodal and not spec.multimodal:
        problems.append(
            f"k2_multimodal=true: {spec.id} has no vision tower; fix: unset k2_multimodal "
            "or choose a multimodal model (Kimi-K2.5 and later)"
        )
    if spec.multimodal and t.multimodal is False and not engine.TEXT_ONLY:
        warnings.append(
            f"k2_multimodal=false: {cluster.engine} {release.version} has no text-only mode "
            f"for {spec.architectures[0]}: the vision tower stays loaded (and counted)"
        )
    if context > spec.max_position_embeddings:
        problems.append(
            f"k2_context_length={context} exceeds {spec.id}'s max_position_embeddings "
            f"{spec.max_position_embeddings}; fix: lower k2_context_length"
        )
    return problems, warnings


def dist_port_span_problems(cluster: Cluster) -> list[str]:
    """The ports the engine takes after its dist port must all exist."""
    engine = REGISTRY[cluster.engine]
    port, span = cluster.tunables.dist_port, engine.DIST_PORT_SPAN
    if not span or port + span <= 65535:
        return []
    return [
        f"{cluster.inventory}: k2_dist_port={port}: {engine.DISPLAY_NAME} also takes the next "
        f"{span} ports, past 65535; expected at most {65535 - span}; "
        "fix: lower k2_dist_port (default 5757)"
    ]


def _readers(name: str) -> dict[str, tuple[str, ...]]:
    """engine -> its layouts that read tunable `name`, where only some engines read it."""
    return {
        e: engine.OWN_TUNABLES[name]
        for e, engine in REGISTRY.items()
        if name in engine.OWN_TUNABLES
    }


def foreign_tunables(cluster: Cluster) -> list[str]:
    """Tunables set in the inventory that the chosen engine and layout never read."""
    problems = []
    t = cluster.tunables
    for name in TUNABLE_VARS:
        if name.removeprefix("k2_") not in t.model_fields_set:
            continue
        readers = _readers(name)
        if not readers or cluster.layout in readers.get(cluster.engine, ()):
            continue
        owner = " or ".join(
            e
            if layouts == layout_names(REGISTRY[e].LAYOUTS)
            else f"{e} layout {', '.join(layouts)}"
            for e, layouts in readers.items()
        )
        problems.append(
            f"{cluster.inventory}: {name}={show(getattr(t, name.removeprefix('k2_')))} is read "
            f"only by {owner}, and this cluster runs {cluster.engine} {cluster.layout}, which "
            f"ignores it; expected tunables of the engine in use; fix: remove {name}"
        )
    return problems


def ipv6_problems(cluster: Cluster) -> list[str]:
    """IPv6 literal addresses for an engine that cannot be wired with them."""
    why = REGISTRY[cluster.engine].NO_IPV6
    v6 = [
        host.name
        for host in cluster.hosts
        for address in dict.fromkeys((host.address, host.local_ip))
        if ip_version(address) == 6
    ]
    if why is None or not v6:
        return []
    return [
        f"{shorten_hosts(v6)}: IPv6 address for {cluster.engine}, whose {why}; expected IPv4 "
        "addresses or host names; fix: set ansible_host to an IPv4 address or a resolvable name"
    ]


def engine_setting_problems(cluster: Cluster) -> list[str]:
    """Inventory settings that only the chosen engine makes wrong: addresses it cannot take,
    ports it takes past the last one, tunables it never reads, an API key or TLS certificate
    its endpoint cannot honour."""
    engine = REGISTRY[cluster.engine]
    return [
        *ipv6_problems(cluster),
        *dist_port_span_problems(cluster),
        *foreign_tunables(cluster),
        # A fleet's endpoint is its router, which takes the key and serves TLS whatever the
        # engine behind it (the instances serve the router on private addresses).
        *(
            unguarded_endpoint_problems(cluster, engine.NO_API_KEY, engine.NO_TLS)
            if not cluster.fleet
            else []
        ),
    ]
