"""The engines' compile and JIT caches on a host volume, so that a restart or a rolling change
finds the kernels the last start compiled (DeepGEMM, torch.compile/Inductor, Triton,
FlashInfer, vLLM's cache root, ...) instead of compiling them again on every GPU. Pure.

The host directory is k2_compile_cache_dir, by default `k2-compile-cache` beside the model
directory (the data disk that already holds the weights); each engine gets its own
subdirectory, mounted read-write at the same path in its containers. Which environment
variables point there is the engine's own knowledge (ContainerNeeds.compile_caches).
"""

from __future__ import annotations

import posixpath

from k2provision.core.records import Cluster
from k2provision.engines import REGISTRY
from k2provision.engines.base import HostRender

DEFAULT_NAME = "k2-compile-cache"
README = "README.k2provision"
README_TEXT = (
    "Compile and JIT caches of the {engine} containers k2provision runs (mounted at this path).\n"
    "Safe to delete while they are stopped: the next start compiles again.\n"
)


def compile_cache_root(cluster: Cluster) -> str:
    """k2_compile_cache_dir, or `k2-compile-cache` beside k2_model_dir."""
    configured = cluster.tunables.compile_cache_dir
    if configured:
        return configured.rstrip("/") or "/"
    return posixpath.join(posixpath.dirname(cluster.model_dir.rstrip("/")), DEFAULT_NAME)


def compile_cache_dir(cluster: Cluster) -> str:
    """The engine's directory under the cache root: the one its containers mount."""
    return posixpath.join(compile_cache_root(cluster), cluster.engine)


def compile_cache_env(cluster: Cluster) -> dict[str, str]:
    """The engine's cache variables, each pointing into its cache directory."""
    base = compile_cache_dir(cluster)
    return {
        name: posixpath.join(base, sub) if sub else base
        for name, sub in REGISTRY[cluster.engine].CONTAINER_NEEDS.compile_caches
    }


def with_compile_caches(cluster: Cluster, rendered: dict[str, HostRender]) -> dict[str, HostRender]:
    """Every GPU process gets the cache variables (its own settings win), and every host that
    runs one gets the cache directory (made by writing its README there)."""
    env = compile_cache_env(cluster)
    if not env:
        return rendered
    readme = posixpath.join(compile_cache_dir(cluster), README)
    out: dict[str, HostRender] = {}
    for host, render in rendered.items():
        processes = tuple(
            p.model_copy(update={"env": {**env, **p.env}}) if p.gpus else p
            for p in render.processes
        )
        files = dict(render.files)
        if any(p.gpus for p in processes):
            files[readme] = README_TEXT.format(engine=REGISTRY[cluster.engine].DISPLAY_NAME)
        out[host] = render.model_copy(update={"processes": processes, "files": files})
    return out
