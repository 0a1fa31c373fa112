"""KTransformers: one host, routed experts on the CPU (GGUF), attention on the GPU."""

from __future__ import annotations

from k2provision.engines import Deployment, HostRender
from k2provision.engines.common import http_gate
from k2provision.models import Process

CONTAINER = "k2-ktransformers"


def render(deployment: Deployment) -> dict[str, HostRender]:
    """The server command on the single host of [nodes]."""
    pool = deployment.pool("nodes")
    t = deployment.cluster.tunables
    model_dir = deployment.cluster.model_dir
    argv = (
        "python3",
        "-m",
        "ktransformers.server.main",
        "--model_path",
        model_dir,
        "--gguf_path",
        model_dir,
        "--cache_lens",
        str(t.ktransformers_cache_lens),
        "--host",
        "0.0.0.0",
        "--port",
        str(t.api_port),
        "--model_name",
        t.served_model_name,
    )
    process = Process(
        name="ktransformers",
        container=CONTAINER,
        image=deployment.image,
        argv=argv,
        env={"PYTHONUNBUFFERED": "1"},
        health=http_gate(pool.master_address, t.api_port, "/v1/models", t.health_timeout_s),
    )
    return {pool.master: HostRender(processes=(process,))}


def endpoint(deployment: Deployment) -> str:
    """The server's base URL."""
    pool = deployment.pool("nodes")
    return f"http://{pool.master_address}:{deployment.cluster.tunables.api_port}"
