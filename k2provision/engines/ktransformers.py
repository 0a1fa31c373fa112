"""KTransformers: one host, routed experts on the CPU (GGUF), attention on the GPU.

Options are those of `ktransformers/server/args.py` (the 0.3 line's ArgumentParser):
`--model_path` (config and tokenizer files), `--gguf_path` (the GGUF experts, with the config
files copied next to them), `--cache_lens` (KV cache size in tokens), `--host`, `--port`,
`--model_name` (the id /v1/models reports) and, only when k2_ktransformers_optimize_config
names one, `--optimize_config_path` (an injection rule file such as the AMX one; give a path
that exists inside the container).

Tool calls: the server has no tool-parser option. When a chat request carries `tools`, its
OpenAI endpoint adds calling instructions to the first message and parses DeepSeek-style
tool-call markers ("tool calls begin" / "tool sep" / "tool call end" special tokens) out of the
reply, always on, with no Kimi-K2-specific parser.
So there is no flag to render (`common.tool_parser("ktransformers")` is None).
"""

from __future__ import annotations

from k2provision.engines.base import Deployment, HostRender
from k2provision.engines.common import http_gate
from k2provision.models import Process

CONTAINER = "k2-ktransformers"

# Every option of the server's ArgumentParser that this renderer may emit.
SERVER_OPTIONS: frozenset[str] = frozenset({
    "--model_path", "--gguf_path", "--cache_lens", "--host", "--port", "--model_name",
    "--optimize_config_path",
})


def render(deployment: Deployment) -> dict[str, HostRender]:
    """The server command on the single host of [nodes]."""
    pool = deployment.pool("nodes")
    t = deployment.cluster.tunables
    model_dir = deployment.cluster.model_dir
    argv = [
        "python3", "-m", "ktransformers.server.main",
        "--model_path", model_dir,
        "--gguf_path", model_dir,
        "--cache_lens", str(t.ktransformers_cache_lens),
        "--host", "0.0.0.0",
        "--port", str(t.api_port),
        "--model_name", t.served_model_name,
    ]
    if t.ktransformers_optimize_config:
        argv += ["--optimize_config_path", t.ktransformers_optimize_config]
    process = Process(
        name="ktransformers",
        container=CONTAINER,
        image=deployment.image,
        argv=tuple(argv),
        env={"PYTHONUNBUFFERED": "1"},
        health=http_gate(pool.master_address, t.api_port, "/v1/models", t.health_timeout_s),
    )
    return {pool.master: HostRender(processes=(process,))}


def endpoint(deployment: Deployment) -> str:
    """The server's base URL."""
    pool = deployment.pool("nodes")
    return f"http://{pool.master_address}:{deployment.cluster.tunables.api_port}"
