"""Server-sent-event streams of the stand-in's generation routes, in the shapes the engines'
own benchmark clients read (`python -m sglang.bench_serving`, `vllm bench serve`).

- SGLang native `/generate` with `"stream": true`: one event per token, each carrying the
  whole text so far and `meta_info` (`id`, `prompt_tokens`, `completion_tokens` so far,
  `finish_reason` null until the last), then `data: [DONE]` (sglang's client reads `text`
  and `meta_info.completion_tokens`).
- `/v1/completions` and `/v1/chat/completions` with `"stream": true`: one chunk per token
  (`choices[0].text` or `choices[0].delta.content`), a last chunk with `finish_reason`,
  then, when `stream_options.include_usage` asks, a usage-only chunk (`choices: []`) as
  OpenAI sends it; without it the usage rides on the last chunk. vLLM's client counts output
  tokens and prompt tokens from that usage.

Behind sglang-router in PD mode (sglang-router 0.3.2), a `/generate` goes unchanged to one
prefill and one decode worker, with `bootstrap_host`, `bootstrap_port` (the prefill's bootstrap
server) and `bootstrap_room` added, and the router streams back the decode worker's answer.
Both stand-ins answer the same stream; the bootstrap fields are accepted and unused (no KV
cache moves between stand-ins).

A stream holds exactly as many tokens as the request asks (`max_new_tokens`, `max_tokens` or
`max_completion_tokens`): a benchmark runs with ignore_eos, so a real engine does the same.
Prompt tokens are counted as `input_ids` when given, else as the prompt's words (the lab's
word-level tokenizer makes these agree). The whole stream is sent as one body, once the time
its tokens take has passed (`drain.decode_time`), so a request is in flight as long as a
real one of its length would be at the stand-in's pace.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

DEFAULT_TOKENS = 16
MAX_TOKENS = 65536
TOKEN_TEXT = " k2"


def wants_stream(doc: dict[str, Any]) -> bool:
    """Whether a request asks for a server-sent-event stream."""
    return doc.get("stream") is True


def _whole(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def token_budget(doc: dict[str, Any]) -> int:
    """The tokens a request asks for (sampling_params.max_new_tokens, max_tokens,
    max_completion_tokens), clamped to 1..MAX_TOKENS."""
    params = doc.get("sampling_params")
    asked = None
    if isinstance(params, dict):
        asked = _whole(params.get("max_new_tokens"))
    for key in ("max_new_tokens", "max_completion_tokens", "max_tokens"):
        if asked is None:
            asked = _whole(doc.get(key))
    return max(1, min(MAX_TOKENS, asked if asked is not None else DEFAULT_TOKENS))


def prompt_tokens(doc: dict[str, Any]) -> int:
    """The prompt's length in tokens: `input_ids` when given, else its words."""
    ids = doc.get("input_ids")
    if isinstance(ids, list) and ids:
        return len(ids)
    if "messages" in doc and isinstance(doc["messages"], list):
        text = " ".join(str(m.get("content", "")) for m in doc["messages"] if isinstance(m, dict))
    else:
        prompt = doc.get("text", doc.get("prompt", ""))
        text = " ".join(map(str, prompt)) if isinstance(prompt, list) else str(prompt)
    return max(1, len(text.split()))


CONTENT_TYPE = "text/event-stream"


def _sse(events: list[dict[str, Any]]) -> bytes:
    body = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
    return body.encode()


def _usage(doc: dict[str, Any], completion: int) -> dict[str, int]:
    prompt = prompt_tokens(doc)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def generate_stream(doc: dict[str, Any]) -> bytes:
    """SGLang's native `/generate` stream."""
    n = token_budget(doc)
    rid = str(doc.get("rid") or uuid.uuid4().hex)
    prompt = prompt_tokens(doc)
    events = []
    for i in range(1, n + 1):
        finish = {"type": "length", "length": n} if i == n else None
        events.append(
            {
                "text": TOKEN_TEXT * i,
                "meta_info": {
                    "id": rid,
                    "finish_reason": finish,
                    "prompt_tokens": prompt,
                    "completion_tokens": i,
                    "cached_tokens": 0,
                },
                "index": 0,
            }
        )
    return _sse(events)


def _openai_stream(doc: dict[str, Any], model: str, chat: bool, fingerprint: str = "") -> bytes:
    n = token_budget(doc)
    base: dict[str, Any] = {
        "id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}",
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": int(time.time()),
        "model": model,
    }
    if fingerprint:
        base["system_fingerprint"] = fingerprint

    def choice(text: str | None, finish: str | None, first: bool = False) -> dict[str, Any]:
        if not chat:
            return {"index": 0, "text": text or "", "finish_reason": finish, "logprobs": None}
        delta: dict[str, Any] = {"content": text} if text is not None else {}
        if first:
            delta["role"] = "assistant"
        return {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}

    events = [{**base, "choices": [choice(TOKEN_TEXT, None, first=i == 0)]} for i in range(n)]
    last: dict[str, Any] = {**base, "choices": [choice(None, "length")]}
    options = doc.get("stream_options")
    usage = _usage(doc, n)
    if isinstance(options, dict) and options.get("include_usage"):
        events += [last, {**base, "choices": [], "usage": usage}]
    else:
        events.append({**last, "usage": usage})
    return _sse(events)


def completion_stream(doc: dict[str, Any], model: str) -> bytes:
    """`/v1/completions` with `"stream": true`."""
    return _openai_stream(doc, model, chat=False)


def chat_stream(doc: dict[str, Any], model: str, fingerprint: str = "") -> bytes:
    """`/v1/chat/completions` with `"stream": true` (each chunk's system_fingerprint the
    server's spec, where it has one)."""
    return _openai_stream(doc, model, chat=True, fingerprint=fingerprint)
