"""Draining on SIGTERM, as the engines' servers do, so a rollout's drain is tested for real.

SGLang 0.5.23 (`srt/managers/tokenizer_manager.py`, SignalHandler.sigterm_handler and
sigterm_watchdog): SIGTERM sets `gracefully_exit`; from then `/health` answers 503
(`srt/entrypoints/http_server.py` health_generate) and the server exits once no request is
left in flight, with no time limit of its own (the container runtime's stop timeout bounds it).
vLLM 0.x (`engine/arg_utils.py` `--shutdown-timeout`, default 0): 0 aborts what is in flight,
N > 0 waits up to N seconds for it.

The stand-in does the same: a draining server refuses new generation requests with 503, its
health routes answer 503, and the process exits once the requests in flight are answered (or
its timeout passes). How long a request is in flight: `K2_STANDIN_TOKEN_SECONDS` (default
0.002 s) for each token it produces, so a stream of 1,000 tokens takes 2 s.
"""

from __future__ import annotations

import threading
import time

from k2standin.common import env_seconds

TOKEN_SECONDS_ENV = "K2_STANDIN_TOKEN_SECONDS"
DEFAULT_TOKEN_SECONDS = 0.002


def decode_time(tokens: int) -> None:
    """Spend the time a request producing `tokens` tokens is in flight."""
    seconds = tokens * env_seconds(TOKEN_SECONDS_ENV, DEFAULT_TOKEN_SECONDS)
    if seconds > 0:
        time.sleep(seconds)


class Drain:
    """The generation requests in flight, and whether new ones are still taken."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._inflight = 0
        self.draining = False

    @property
    def inflight(self) -> int:
        with self._cond:
            return self._inflight

    def enter(self) -> bool:
        """Count a new request in; False when draining (the request is refused)."""
        with self._cond:
            if self.draining:
                return False
            self._inflight += 1
            return True

    def leave(self) -> None:
        """A request counted in has been answered."""
        with self._cond:
            self._inflight -= 1
            self._cond.notify_all()

    def start(self) -> int:
        """Stop taking requests; the number still in flight."""
        with self._cond:
            self.draining = True
            return self._inflight

    def wait_idle(self, timeout: float | None) -> bool:
        """Wait until nothing is in flight (None: no limit); False when the timeout passed."""
        with self._cond:
            return self._cond.wait_for(lambda: self._inflight == 0, timeout)
