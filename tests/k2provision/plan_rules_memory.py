"""Per-plan rules for memory, restarts and the smaller truths: each `check_*` takes a plan the
catalog admits and returns what is wrong with it (empty when nothing is). They run over every
admitted plan of an enumeration (`problems`), so a rule holds for the whole plan space, not
for examples.

- reserve terms: the reserve is the sum of its terms; the all-to-all share is part of the
  communication buffers; a pool whose terms are scaled to a measurement names it.
- plans at the edge: a pool whose KV headroom per GPU is within the fit's calibration error
  carries the AT THE EDGE warning, and only such a pool does.
- FP8 KV on SGLang-based servers: only with an attention backend that keeps it FP8.
- compile caches: every GPU process points the engine's cache variables into the plan's
  compile cache directory, and the host gets that directory.
- vLLM on one host: vLLM's default executor, no Ray; across hosts Ray.
- vLLM multimodal with TP: the vision encoder data-parallel.
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable, Iterable

from k2provision.core.records import Plan, Process
from k2provision.engines import REGISTRY
from k2provision.engines.calibration import fit_error_gib
from k2provision.engines.sglang import FP8_KV_BACKEND, FP8_KV_BACKEND_BY_GPU
from k2provision.plan.fit import kv_headroom_gib

Rule = Callable[[Plan], list[str]]
FP8_KV_BACKENDS = {FP8_KV_BACKEND, *FP8_KV_BACKEND_BY_GPU.values()}
SGLANG_SERVER = ("python3", "-m", "sglang.launch_server")


def _processes(plan: Plan) -> Iterable[Process]:
    for host in plan.hosts:
        yield from host.processes


def _flag(argv: tuple[str, ...], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv else None


def check_reserve_terms(plan: Plan) -> list[str]:
    found = []
    for r in plan.fit:
        m = r.reserve
        terms = m.activations + m.cuda_graphs + m.comm_buffers + m.runtime + m.encoder + m.margin
        if abs(terms - m.total) > 1e-6 or abs(round(m.total, 1) - r.reserve_gib) > 1e-6:
            found.append(f"[{r.pool}] reserve {r.reserve_gib} is not the sum of its terms")
        if not 0 <= m.all2all <= m.comm_buffers + 1e-6:
            found.append(f"[{r.pool}] all2all {m.all2all} outside comm buffers {m.comm_buffers}")
        if plan.engine == "sglang" and r.pool == "decode" and "sglang#24453" not in m.calibration:
            found.append(f"[{r.pool}] DeepEP decode reserve does not name its calibration")
    return found


def check_edge_warning(plan: Plan) -> list[str]:
    error = fit_error_gib()
    found = []
    for r in plan.fit:
        at_edge = r.fits and kv_headroom_gib(r) < error
        warned = any(w.startswith(f"[{r.pool}] AT THE EDGE") for w in plan.warnings)
        if at_edge != warned:
            found.append(
                f"[{r.pool}] headroom {kv_headroom_gib(r):.2f} GiB vs error {error}: "
                f"{'no' if at_edge else 'a'} AT THE EDGE warning"
            )
    return found


def check_fp8_kv_backend(plan: Plan) -> list[str]:
    found = []
    for proc in _processes(plan):
        if proc.argv[:3] != SGLANG_SERVER:
            continue
        if _flag(proc.argv, "--kv-cache-dtype") in ("fp8_e4m3", "fp8_e5m2"):
            backend = _flag(proc.argv, "--attention-backend")
            if backend not in FP8_KV_BACKENDS:
                found.append(f"{proc.name}: FP8 KV cache with attention backend {backend}")
    return found


def check_compile_caches(plan: Plan) -> list[str]:
    cache = plan.container.compile_cache
    wanted = REGISTRY[plan.engine].CONTAINER_NEEDS.compile_caches
    found = []
    if not cache or not posixpath.isabs(cache):
        return [f"no compile cache directory: {cache!r}"]
    for host in plan.hosts:
        gpu_procs = [p for p in host.processes if p.gpus]
        if gpu_procs and not any(f.startswith(cache + "/") for f in host.files):
            found.append(f"{host.name}: the compile cache directory is not made")
        for proc in gpu_procs:
            for name, sub in wanted:
                value = proc.env.get(name, "")
                if value != (posixpath.join(cache, sub) if sub else cache):
                    found.append(f"{host.name} {proc.name}: {name}={value!r}, not under {cache}")
    return found


def check_vllm_executor(plan: Plan) -> list[str]:
    if plan.engine != "vllm" or plan.layout == "dp_ep":
        return []
    argvs = [p.argv for p in _processes(plan)]
    ray = any(a[:2] == ("ray", "start") for a in argvs) or any(
        _flag(a, "--distributed-executor-backend") == "ray" for a in argvs
    )
    one_host = len(plan.pools[0].hosts) == 1
    if one_host and ray:
        return ["one-host vLLM runs Ray instead of its default executor"]
    if not one_host and not ray:
        return ["multi-host vLLM TP without its Ray cluster"]
    return []


def check_vllm_encoder(plan: Plan) -> list[str]:
    if plan.engine != "vllm":
        return []
    found = []
    for proc in _processes(plan):
        if proc.argv[:2] != ("vllm", "serve"):
            continue
        tp = int(_flag(proc.argv, "--tensor-parallel-size") or 1)
        vision = any(r.vision_gib > 0 for r in plan.fit)
        mode = _flag(proc.argv, "--mm-encoder-tp-mode")
        if vision and tp > 1 and mode != "data":
            found.append(f"{proc.name}: vision tower loaded at TP {tp} with encoder mode {mode}")
        if not vision and mode is not None:
            found.append(f"{proc.name}: encoder mode {mode} without a vision tower")
    return found


RULES: tuple[Rule, ...] = (
    check_reserve_terms,
    check_edge_warning,
    check_fp8_kv_backend,
    check_compile_caches,
    check_vllm_executor,
    check_vllm_encoder,
)


def problems(plan: Plan) -> list[str]:
    """Every rule's findings for one plan."""
    return [f"{rule.__name__}: {p}" for rule in RULES for p in rule(plan)]
