"""Engine renderers: Deployment -> per-host processes and files.

Each engine is one module exposing `render(deployment) -> dict[host, HostRender]` and
`endpoint(deployment) -> str` (the `Renderer` protocol of engines/base.py, where the shared
types live); REGISTRY maps engine names to those modules. Engine modules import from
engines/base.py, never from this package, so the registry's imports run one way.
"""

from __future__ import annotations

from k2provision.engines import ktransformers, sglang, trtllm, vllm
from k2provision.engines.base import Renderer

# Modules satisfy Renderer structurally.
REGISTRY: dict[str, Renderer] = {
    "sglang": sglang,
    "trtllm": trtllm,
    "vllm": vllm,
    "ktransformers": ktransformers,
}
