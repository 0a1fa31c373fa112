"""Traffic through a lab endpoint: a few threads streaming chat completions until stopped.

For the lab's fleet tests and the rolling benchmark: each request streams ``tokens`` tokens
(at the stand-in's pace, ``K2_STANDIN_TOKEN_SECONDS`` each, so it is in flight a while and a
drain has something to finish) for a prompt of its own (so a cache-aware router spreads them
over its workers), and every answer is kept with the time it came back, so a
run can say how many requests failed and when. Bounded in count (``max_requests``) and in time
(each request times out); stop it by leaving the ``with`` block::

    with Traffic("http://10.76.0.11:8000") as traffic:
        ...                                   # roll, restart, stop a host
    assert traffic.failures == []
"""

from __future__ import annotations

import json
import secrets
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from dataclasses import dataclass

OK = "200"


@dataclass(frozen=True)
class Answer:
    """One request's outcome: ``200``, an HTTP status, or ``no answer (...)``."""

    outcome: str
    started: float
    ended: float
    """time.monotonic() when the answer (or the error) came back."""
    at: float = 0.0
    """time.time() when the request was sent (to compare with a run's UTC times)."""
    fingerprint: str = ""
    """The answer's system_fingerprint (the lab stand-ins': the spec that answered)."""


class Traffic:
    """``threads`` clients streaming through ``endpoint`` until stopped or ``max_requests``."""

    def __init__(
        self,
        endpoint: str,
        *,
        model: str = "kimi-k2",
        tokens: int = 1000,
        threads: int = 4,
        max_requests: int = 2000,
        timeout: float = 60.0,
    ) -> None:
        self.endpoint = endpoint
        self.model = model
        self.tokens = tokens
        self.max_requests = max_requests
        self.timeout = timeout
        self.answers: list[Answer] = []
        self.stopping = threading.Event()
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._loop, daemon=True) for _ in range(threads)]

    def __enter__(self) -> Traffic:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    def stop(self) -> None:
        """Stop sending and wait for the requests in flight (each bounded by its timeout)."""
        self.stopping.set()
        for thread in self.threads:
            thread.join(timeout=self.timeout + 5)

    @property
    def counts(self) -> Counter[str]:
        """How many requests ended each way."""
        with self.lock:
            return Counter(a.outcome for a in self.answers)

    @property
    def failures(self) -> list[Answer]:
        """The requests not answered 200 with a complete stream, in the order they ended."""
        with self.lock:
            return sorted((a for a in self.answers if a.outcome != OK), key=lambda a: a.ended)

    def since(self, moment: float) -> list[Answer]:
        """The answers of requests that ended after ``moment`` (time.monotonic())."""
        with self.lock:
            return [a for a in self.answers if a.ended >= moment]

    def _one(self) -> tuple[str, str]:
        body = {
            "model": self.model,
            # A fresh prefix per request: cache-aware routing then spreads the requests by
            # load instead of sending every copy of one prompt to the worker that has it.
            "messages": [{"role": "user", "content": f"{secrets.token_hex(8)} hello"}],
            "max_tokens": self.tokens,
            "stream": True,
        }
        request = urllib.request.Request(
            f"{self.endpoint}/v1/chat/completions",
            json.dumps(body).encode(),
            {"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as reply:
                text = reply.read().decode()
                outcome = OK if "[DONE]" in text else "200 without [DONE]"
                return outcome, _fingerprint(text)
        except urllib.error.HTTPError as error:
            return str(error.code), ""
        except OSError as error:
            return f"no answer ({error})", ""

    def _loop(self) -> None:
        while not self.stopping.is_set():
            with self.lock:
                if len(self.answers) >= self.max_requests:
                    return
            at, started = time.time(), time.monotonic()
            outcome, fingerprint = self._one()
            with self.lock:
                self.answers.append(
                    Answer(outcome, started, time.monotonic(), at=at, fingerprint=fingerprint)
                )


def _fingerprint(stream: str) -> str:
    """The system_fingerprint of a streamed answer's first chunk that has one ("": none)."""
    for line in stream.splitlines():
        if not line.startswith("data: {"):
            continue
        try:
            chunk = json.loads(line.removeprefix("data: "))
        except ValueError:
            continue
        if isinstance(chunk, dict) and chunk.get("system_fingerprint"):
            return str(chunk["system_fingerprint"])
    return ""
