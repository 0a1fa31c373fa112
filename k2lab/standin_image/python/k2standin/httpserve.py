"""A small OpenAI-compatible HTTP server (stdlib ThreadingHTTPServer) for the stand-ins.

It answers the endpoints k2provision's health gates and verify role use (`/health`,
`/health_generate`, `/liveness`, `/readiness`, `/v1/models`, `/server_info`; `/standin/info`
for the lab's tests) and returns a well-formed chat completion whose content says it came
from the stand-in. No model runs.
"""

from __future__ import annotations

import json
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from k2standin import faults, metrics, openai_shapes, streaming
from k2standin.common import StartError, log
from k2standin.drain import Drain, decode_time

STANDIN_REPLY = "ready (stand-in)"
REPLY_TOKENS = 3  # the tokens of a non-streamed answer, for its time in flight


@dataclass
class Response:
    status: int
    body: bytes = b""
    content_type: str = "application/json"


def json_response(status: int, doc: Any) -> Response:
    return Response(status, json.dumps(doc).encode() + b"\n")


def error_response(status: int, message: str, kind: str = "BadRequestError") -> Response:
    return json_response(
        status, {"object": "error", "message": message, "type": kind, "code": status}
    )


GetRoute = Callable[[], Response]
PostRoute = Callable[[bytes], Response]


class Api:
    """Routes by exact path; the POST routes in `drained` are counted in flight by `drain`
    until their answer is written, and refused with 503 once it drains."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.get: dict[str, GetRoute] = {}
        self.post: dict[str, PostRoute] = {}
        self.drained: set[str] = set()
        self.drain = Drain()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128


def _handler_class(api: Api) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = f"k2-standin-{api.name}"
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            del format, args  # quiet: health gates poll often

        def _send(self, response: Response) -> None:
            self.send_response(response.status)
            self.send_header("Content-Type", response.content_type)
            self.send_header("Content-Length", str(len(response.body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(response.body)

        def _path(self) -> str:
            return self.path.split("?", 1)[0].rstrip("/") or "/"

        def do_GET(self) -> None:
            route = api.get.get(self._path())
            if route is None:
                self._send(error_response(404, f"no route GET {self._path()}", "NotFoundError"))
                return
            self._send(route())

        def do_HEAD(self) -> None:
            self.do_GET()

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length > 0 else b""
            route = api.post.get(self._path())
            if route is None:
                self._send(error_response(404, f"no route POST {self._path()}", "NotFoundError"))
                return
            if self._path() not in api.drained:
                self._send(route(body))
                return
            if not api.drain.enter():
                self._send(
                    error_response(
                        503, f"{api.name} stand-in is draining (SIGTERM)", "ServiceUnavailableError"
                    )
                )
                return
            try:
                self._send(route(body))
            finally:
                api.drain.leave()

    return Handler


class HttpServer:
    """One bound server, served from a daemon thread."""

    def __init__(self, api: Api, host: str, port: int) -> None:
        bind_host = host.strip("[]")
        server_cls: type[_Server] = _Server
        if ":" in bind_host:

            class _Server6(_Server):
                address_family = socket.AF_INET6

            server_cls = _Server6
        self.server = server_cls((bind_host, port), _handler_class(api))
        self.host = host
        self.port = int(self.server.server_address[1])
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True
        )
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def listen(api: Api, host: str, port: int, options: str = "--host/--port") -> HttpServer:
    """Bind and serve, or StartError naming the options that chose the address."""
    try:
        return HttpServer(api, host, port)
    except OSError as exc:
        reason = exc.strerror or exc
        raise StartError(f"cannot listen on {host}:{port} ({options}): {reason}") from exc


def parse_json(body: bytes) -> dict[str, Any] | Response:
    try:
        doc = json.loads(body or b"{}")
    except ValueError as exc:
        return error_response(400, f"request body is not JSON: {exc}")
    if not isinstance(doc, dict):
        return error_response(400, "request body must be a JSON object")
    return doc


class ModelServer:
    """The OpenAI-compatible face of one engine server.

    `ready` gates /health, /readiness and the generation routes (503 until set, with
    `reason`); /liveness always answers.
    """

    def __init__(
        self,
        engine: str,
        model_id: str | None,
        info: dict[str, Any],
        *,
        strict_model: bool = False,
    ) -> None:
        self.engine = engine
        self.model_id = model_id
        self.info = info
        self.strict_model = strict_model
        self.info_hooks: list[Callable[[], dict[str, Any]]] = []
        # The launch flags the chat answers' shapes depend on (the server sets them).
        self.flags = openai_shapes.ServerFlags(engine)
        self.ready = threading.Event()
        self.reason = "starting"
        self.created = int(time.time())
        self.answered = 0  # generation requests answered, for /metrics
        # A PD decode server's check of the prefill a request was paired with (None: no
        # check): None where the request names no prefill that answers, "" for a pair of one
        # generation, else why the pair is wrong. Checked and refused pairs are counted.
        self.pair_check: Callable[[dict[str, Any]], str | None] | None = None
        self.checked_pairs = 0
        self.mixed_pairs = 0
        self.api = Api(engine)
        g, p = self.api.get, self.api.post
        # What the stand-in knows of itself, for the lab's tests, under a path no engine has.
        g["/standin/info"] = self.server_info
        if engine == "trtllm":
            self._trtllm_routes()
            return
        g["/health"] = self.health
        g["/health_generate"] = self.health
        g["/readiness"] = self.health
        g["/liveness"] = self.liveness
        g["/v1/models"] = self.models
        if engine != "vllm":
            # SGLang's introspection routes, which sglang-router asks a new worker for. vLLM
            # 0.33.0 serves /server_info only with VLLM_SERVER_DEV_MODE
            # (entrypoints/launchers/api_server/routers.py) and no /model_info, so its
            # stand-in serves neither and a fleet's router meets vLLM's real surface.
            # SGLang's /ready (its launch gate and a fleet router's health checks).
            g["/ready"] = self.health
            g["/server_info"] = self.server_info
            g["/get_server_info"] = self.server_info
            g["/get_model_info"] = self.model_info
            g["/model_info"] = self.model_info
            # SGLang 0.5.23's per-DP-rank load route (entrypoints/v1_loads.py), which the
            # monitoring plan scrapes on the first host of an instance spread over several.
            g["/v1/loads"] = self.loads
        g["/version"] = self.version
        g["/metrics"] = self.metrics
        p["/v1/chat/completions"] = self.chat
        p["/v1/completions"] = self.completion
        p["/generate"] = self.generate
        self.api.drained.update(p)

    def _trtllm_routes(self) -> None:
        """trtllm-serve 1.2's routes and no others (tensorrt_llm/serve/openai_server.py,
        OpenAIServer.register_routes): /health (200 while the server is up; it only listens
        once the model is built), /health_generate, /version, /v1/models, /metrics (the
        executor's iteration stats as a JSON list, not Prometheus text), /perf_metrics,
        /server_info (the RL routes' {"disaggregated_params": ...}; no model id, no
        /model_info, so a router cannot name the worker itself), and the two OpenAI
        generation routes a fleet serves."""
        g, p = self.api.get, self.api.post
        g["/health"] = self.health
        g["/health_generate"] = self.health
        g["/version"] = self.version
        g["/v1/models"] = self.models
        g["/metrics"] = self.iteration_stats
        g["/perf_metrics"] = self.iteration_stats
        g["/server_info"] = self.disaggregated_params
        p["/v1/chat/completions"] = self.chat
        p["/v1/completions"] = self.completion
        self.api.drained.update(p)

    def iteration_stats(self) -> Response:
        """trtllm-serve's /metrics and /perf_metrics: a JSON list (no iterations here)."""
        return json_response(200, [])

    def disaggregated_params(self) -> Response:
        return json_response(200, {"disaggregated_params": None})

    def set_ready(self) -> None:
        self.reason = "ready"
        self.ready.set()
        faults.on_ready(self.engine)

    def set_not_ready(self, reason: str) -> None:
        self.reason = reason
        self.ready.clear()

    def _unready(self) -> Response | None:
        if self.ready.is_set():
            return None
        return error_response(
            503, f"{self.engine} stand-in is not ready: {self.reason}", "ServiceUnavailableError"
        )

    # ---------------------------------------------------------------- GET

    def health(self) -> Response:
        if self.api.drain.draining:
            return error_response(
                503, f"{self.engine} stand-in is draining (SIGTERM)", "ServiceUnavailableError"
            )
        if faults.active("never_healthy"):
            return error_response(
                503, "never healthy (K2_LAB_FAULT=never_healthy)", "ServiceUnavailableError"
            )
        return self._unready() or Response(200, b"", "text/plain")

    def liveness(self) -> Response:
        return Response(200, b"", "text/plain")

    def models(self) -> Response:
        unready = self._unready()
        if unready is not None or self.model_id is None:
            return unready or error_response(503, "served model not known yet")
        return json_response(
            200,
            {
                "object": "list",
                "data": [
                    {
                        "id": self.model_id,
                        "object": "model",
                        "created": self.created,
                        "owned_by": f"{self.engine} (stand-in)",
                        "root": self.info.get("model_path"),
                        # SGLang's --context-length, vLLM's --max-model-len (None: the model's own).
                        "max_model_len": self.info.get(
                            "max_model_len", self.info.get("context_length")
                        ),
                    }
                ],
            },
        )

    def server_info(self) -> Response:
        extra: dict[str, Any] = {}
        for hook in self.info_hooks:
            extra.update(hook())
        return json_response(
            200,
            {
                **self.info,
                **extra,
                "standin": True,
                "engine": self.engine,
                "served_model_name": self.model_id,
                "ready": self.ready.is_set(),
                "status": self.reason,
                "answered": self.answered,
            },
        )

    def model_info(self) -> Response:
        return json_response(
            200,
            {
                "model_path": self.info.get("model_path"),
                "served_model_name": self.model_id,
                "is_generation": True,
            },
        )

    def version(self) -> Response:
        return json_response(200, {"version": "stand-in", "engine": self.engine})

    def loads(self) -> Response:
        """The Prometheus form of /v1/loads (`format=prometheus`, what the plan scrapes): the
        core gauges, one sample per DP rank, as sglang's `_format_loads_prometheus` writes
        them (the stand-in holds no queue: idle values)."""
        text = metrics.rank_loads()
        return Response(200, text.encode(), "text/plain; version=0.0.4; charset=utf-8")

    def metrics(self) -> Response:
        text = metrics.exposition(
            self.engine,
            self.answered,
            ready=self.ready.is_set(),
            pairs=(self.checked_pairs, self.mixed_pairs),
        )
        return Response(200, text.encode(), "text/plain; version=0.0.4")

    def _mixed(self, doc: dict[str, Any]) -> Response | None:
        """A request paired with a prefill of another generation: counted and refused (a real
        decode would fail the KV transfer, or decode another model's cache)."""
        why = self.pair_check(doc) if self.pair_check is not None else None
        if why is None:
            return None
        self.checked_pairs += 1
        if not why:
            return None
        self.mixed_pairs += 1
        log(self.engine, f"refused a mixed prefill-decode pair: {why}")
        return error_response(
            500, f"mixed prefill-decode generations: {why}", "InternalServerError"
        )

    # ---------------------------------------------------------------- POST

    def _check_model(self, doc: dict[str, Any]) -> Response | None:
        wanted = doc.get("model")
        if self.strict_model and wanted is not None and wanted != self.model_id:
            return error_response(404, f"The model `{wanted}` does not exist.", "NotFoundError")
        return None

    def chat(self, body: bytes) -> Response:
        unready = self._unready()
        if unready is not None:
            return unready
        doc = parse_json(body)
        if isinstance(doc, Response):
            return doc
        messages = doc.get("messages")
        if (
            not isinstance(messages, list)
            or not messages
            or not all(isinstance(m, dict) and "role" in m for m in messages)
        ):
            return error_response(400, "messages: expected a non-empty list of {role, content}")
        bad_model = self._check_model(doc) or self._mixed(doc)
        if bad_model is not None:
            return bad_model
        if faults.active("wrong_answer"):
            return json_response(200, faults.wrong_chat_body(self.model_id or ""))
        faults.slow_answer()
        self.answered += 1
        # The spec this server runs (its launch argv's digest) as OpenAI's system_fingerprint:
        # a client tells which spec answered it (a canary's share).
        spec = str(self.info.get("standin_spec", ""))
        if streaming.wants_stream(doc):
            decode_time(streaming.token_budget(doc))
            return Response(
                200,
                streaming.chat_stream(doc, self.model_id or "", spec),
                streaming.CONTENT_TYPE,
            )
        decode_time(REPLY_TOKENS)
        answer = openai_shapes.chat_completion(
            doc,
            self.flags,
            self.model_id or "",
            ident=f"chatcmpl-{uuid.uuid4().hex}",
            created=int(time.time()),
        )
        return json_response(200, {**answer, "system_fingerprint": spec} if spec else answer)

    def completion(self, body: bytes) -> Response:
        unready = self._unready()
        if unready is not None:
            return unready
        doc = parse_json(body)
        if isinstance(doc, Response):
            return doc
        if "prompt" not in doc:
            return error_response(400, "prompt is required")
        bad_model = self._check_model(doc) or self._mixed(doc)
        if bad_model is not None:
            return bad_model
        if streaming.wants_stream(doc):
            decode_time(streaming.token_budget(doc))
            return Response(
                200, streaming.completion_stream(doc, self.model_id or ""), streaming.CONTENT_TYPE
            )
        decode_time(REPLY_TOKENS)
        return json_response(
            200,
            {
                "id": f"cmpl-{uuid.uuid4().hex}",
                "object": "text_completion",
                "created": int(time.time()),
                "model": self.model_id,
                "choices": [
                    {"index": 0, "text": STANDIN_REPLY, "finish_reason": "stop", "logprobs": None}
                ],
                "usage": _usage(str(doc.get("prompt"))),
            },
        )

    def generate(self, body: bytes) -> Response:
        unready = self._unready()
        if unready is not None:
            return unready
        doc = parse_json(body)
        if isinstance(doc, Response):
            return doc
        mixed = self._mixed(doc)
        if mixed is not None:
            return mixed
        if streaming.wants_stream(doc):
            decode_time(streaming.token_budget(doc))
            return Response(200, streaming.generate_stream(doc), streaming.CONTENT_TYPE)
        decode_time(REPLY_TOKENS)
        return json_response(
            200,
            {
                "text": STANDIN_REPLY,
                "meta_info": {
                    "id": uuid.uuid4().hex,
                    "finish_reason": {"type": "stop"},
                    "completion_tokens": REPLY_TOKENS,
                },
            },
        )


def _usage(prompt: str) -> dict[str, int]:
    prompt_tokens = max(1, len(prompt.split()))
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": 3,
        "total_tokens": prompt_tokens + 3,
    }
