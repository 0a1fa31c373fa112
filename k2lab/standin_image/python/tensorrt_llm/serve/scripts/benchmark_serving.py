"""Stand-in for TensorRT-LLM's serving benchmark client (a test double; lab image only).

`python3 -m tensorrt_llm.serve.scripts.benchmark_serving` is the client `k2provision bench`
runs for TensorRT-LLM plans (k2provision/engines/trtllm.py, BENCH_CLIENT). The real one lives
in the tensorrt_llm wheel, which is not on PyPI (only a stub sdist that fetches the wheel from
pypi.nvidia.com), and the lab reaches PyPI alone, so the lab runs this stand-in instead. It
follows the 1.2 line's tensorrt_llm/serve/scripts/benchmark_serving.py and
backend_request_func.py; stdlib only (threads and urllib, not asyncio and aiohttp).

What it does as the real client does:
- its options, defaults and choices (the ones listed in `parser`; any other option exits 2,
  as argparse does), `--model` required;
- the random dataset with `--random-ids`: lengths drawn from [L(1-r), L(1+r)], ids
  `(offset + i + j) % vocab` after `--random-prefix-len` random ids;
- one test request from the first prompt (unless `--no-test-input`), "Initial test run
  failed" and exit 1 when it fails;
- the requests over HTTP at `--request-rate` (gamma intervals, `--burstiness`) and at most
  `--max-concurrency` at once: the openai backend POSTs `{base}{endpoint}` with a completions
  body (model, prompt, temperature 0, repetition_penalty 1, max_tokens = the output length,
  logprobs, stream, stream_options.include_usage, ignore_eos when asked), openai-chat POSTs
  /v1/chat/completions; `Authorization: Bearer $OPENAI_API_KEY`; proxies and SSL_CERT_FILE
  from the environment;
- TTFT, ITL, E2EL from the stream's chunk arrivals, TPOT = (E2EL - TTFT) / (output - 1); output
  tokens from the stream's usage chunk (`completion_tokens`), input tokens the sampled prompt
  lengths; the summary on stdout; with `--save-result` the result JSON with the real keys in
  the real order (`"request_goodput:"` with its colon, no `failed`), at `--result-dir` joined
  to `--result-filename`; exit 0 once it ran, failed requests showing as completed <
  num_prompts.

What it refuses as the real one does (exit 1, the real message): the random dataset without
`--random-ids` and without `--dataset-path`/`--download-path`, `--random-range-ratio` >= 1, a
burstiness <= 0, `--goodput`/`--metadata` not in their formats.

What it does not do: load a tokenizer (no transformers here; `--tokenizer` is only reported as
`tokenizer_id`): the vocabulary is Kimi-K2's 163840 ids and a prompt is one word per id, which
the stand-in server counts as one token each; a stream without usage counts one token per
chunk with text (the stand-in streams one token a chunk) where the real client would
re-tokenize the text. Other datasets (sharegpt, burstgpt, sonnet, hf, random_image,
trtllm_custom, random sampled from ShareGPT text) exit 1 saying the stand-in lacks them.
Not here: their options, --lora-modules, --save-request-time-breakdown,
SAVE_TO_PYTORCH_BENCHMARK_FORMAT, the progress bar; the seed draws other ids than the real
client's torch generator.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import sys
import time
import traceback
import urllib.error
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

BACKENDS = ("openai", "openai-chat")
DATASETS = ("sharegpt", "burstgpt", "sonnet", "random", "random_image", "hf", "trtllm_custom")
VOCAB_SIZE = 163840  # Kimi-K2's tokenizer.vocab_size, which the real client reads
TIMEOUT_S = 6 * 60 * 60  # the real client's aiohttp total timeout
METRICS = (
    ("ttft", "TTFT", "Time to First Token"),
    ("tpot", "TPOT", "Time per Output Token (excl. 1st token)"),
    ("itl", "ITL", "Inter-token Latency"),
    ("e2el", "E2EL", "End-to-end Latency"),
)
GOODPUT_METRICS = ("ttft", "tpot", "e2el")


class Refused(Exception):
    """What the real client stops on (an exception there): exit 1 with its message."""


@dataclass(frozen=True)
class Sample:
    prompt: str | list[int]
    prompt_len: int
    output_len: int


@dataclass
class Output:
    prompt_len: int
    success: bool = False
    latency: float = 0.0
    output_tokens: int = 0
    ttft: float = 0.0
    itl: list[float] = field(default_factory=list)
    generated_text: str = ""
    error: str = ""
    exception_type: str | None = None


def parser() -> argparse.ArgumentParser:
    """The real client's options that matter for a serving run, with its defaults."""
    p = argparse.ArgumentParser(
        description="Benchmark the online serving throughput (k2provision stand-in)."
    )
    add = p.add_argument
    add("--backend", type=str, default="openai", choices=list(BACKENDS))
    add("--base-url", type=str, default=None)
    add("--host", type=str, default="127.0.0.1")
    add("--port", type=int, default=8000)
    add("--endpoint", type=str, default="/v1/completions")
    add("--dataset-name", type=str, default="sharegpt", choices=list(DATASETS))
    add("--dataset-path", type=str, default=None)
    add("--download-path", type=str, default=None)
    add("--download-timeout", type=int, default=180)
    add("--max-concurrency", type=int, default=None)
    add("--model", type=str, required=True)
    add("--served-model-name", type=str, default=None)
    add("--tokenizer", type=str, default=None)
    add("--tokenizer-mode", type=str, default="auto", choices=["auto", "slow", "mistral", "custom"])
    add("--trust-remote-code", action="store_true")
    add("--num-prompts", type=int, default=1000)
    add("--logprobs", type=int, default=None)
    add("--request-rate", type=float, default=float("inf"))
    add("--burstiness", type=float, default=1.0)
    add("--non-streaming", action="store_true")
    add("--seed", type=int, default=0)
    add("--disable-tqdm", action="store_true")
    add("--profile", action="store_true")
    add("--save-result", action="store_true")
    add("--save-detailed", action="store_true")
    add("--metadata", metavar="KEY=VALUE", nargs="*")
    add("--result-dir", type=str, default=None)
    add("--result-filename", type=str, default=None)
    add("--ignore-eos", action="store_true")
    add("--percentile-metrics", type=str, default="ttft,tpot,itl")
    add("--metric-percentiles", type=str, default="99")
    add("--goodput", nargs="+", required=False)
    add("--no-test-input", action="store_true")
    add("--top-p", type=float, default=None)
    add("--top-k", type=int, default=None)
    add("--min-p", type=float, default=None)
    add("--temperature", type=float, default=None)
    random_group = p.add_argument_group("random dataset options")
    radd = random_group.add_argument
    radd("--random-input-len", type=int, default=1024)
    radd("--random-output-len", type=int, default=128)
    radd("--random-range-ratio", type=float, default=0.0)
    radd("--random-prefix-len", type=int, default=0)
    radd("--random-ids", action="store_true")
    radd("--tokenize-on-client", action="store_true")
    return p


# ---------------------------------------------------------------- prompts


def words(ids: Sequence[int]) -> str:
    """Text standing for token ids (the real client decodes them with the tokenizer): one
    word per id, so the stand-in server counts len(ids) prompt tokens."""
    return " ".join(f"t{i}" for i in ids)


def sample_requests(args: argparse.Namespace) -> list[Sample]:
    """The random dataset, with the real RandomDataset's checks in its order."""
    if args.dataset_name != "random":
        raise Refused(
            f"--dataset-name {args.dataset_name}: the stand-in samples only the random "
            "dataset (--dataset-name random --random-ids)"
        )
    if not args.random_ids:
        if args.dataset_path is None and args.download_path is None:
            raise Refused(
                "Please provide a download path to sample from the ShareGPT dataset for more "
                "consistent ISL by specifying it with the `--download-path` option. "
                "Alternatively, you can use the `--random-ids` option to skip the sampling, "
                "which may introduce some unexpected ISL variation even the range ratio is "
                "set to 0."
            )
        raise Refused("the stand-in does not sample ShareGPT text: use --random-ids")
    ratio = args.random_range_ratio
    if ratio >= 1.0:
        raise Refused("random_range_ratio must be < 1.0 to ensure a valid sampling range")
    rng = random.Random(args.seed)
    prefix = [rng.randrange(VOCAB_SIZE) for _ in range(args.random_prefix_len)]
    n = args.num_prompts

    def lengths(length: int) -> list[int]:
        low, high = int(length * (1 - ratio)), int(length * (1 + ratio))
        return [rng.randint(low, high) for _ in range(n)]

    input_lens, output_lens = lengths(args.random_input_len), lengths(args.random_output_len)
    offsets = [rng.randrange(VOCAB_SIZE) for _ in range(n)]
    samples = []
    for i in range(n):
        ids = prefix + [(offsets[i] + i + j) % VOCAB_SIZE for j in range(input_lens[i])]
        prompt: str | list[int] = ids if args.tokenize_on_client else words(ids)
        samples.append(Sample(prompt, len(prefix) + input_lens[i], output_lens[i]))
    return samples


# ---------------------------------------------------------------- one request


def payload(args: argparse.Namespace, sample: Sample, extra: dict[str, Any]) -> dict[str, Any]:
    """The request body of the real client's openai / openai-chat request functions."""
    streaming = not args.non_streaming
    doc: dict[str, Any] = {"model": args.served_model_name or args.model}
    if args.backend == "openai-chat":
        doc["messages"] = []
        if isinstance(sample.prompt, list):
            doc["prompt_token_ids"] = sample.prompt
        else:
            doc["messages"].append(
                {"role": "user", "content": [{"type": "text", "text": sample.prompt}]}
            )
        doc.update(temperature=0.0, max_completion_tokens=sample.output_len, stream=streaming)
    else:
        doc.update(
            prompt=sample.prompt,
            temperature=0.0,
            repetition_penalty=1.0,
            max_tokens=sample.output_len,
            logprobs=args.logprobs,
            stream=streaming,
        )
    if streaming:
        doc["stream_options"] = {"include_usage": True}
    if args.ignore_eos:
        doc["ignore_eos"] = True
    doc.update(extra)
    return doc


def send(url: str, body: dict[str, Any], prompt_len: int, chat: bool) -> Output:
    """POST one request; time its stream's chunks as the real request functions do."""
    out = Output(prompt_len)
    headers = {
        "Content-Type": "application/json",
        # As the real client: the literal "None" when OPENAI_API_KEY is not set.
        "Authorization": f"Bearer {os.environ.get('OPENAI_API_KEY')}",
    }
    request = urllib.request.Request(url, json.dumps(body).encode(), headers, method="POST")
    start = time.perf_counter()
    recent = start
    text_chunks = 0
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
            if not body.get("stream"):
                data = json.loads(response.read())
                choice = data["choices"][0]
                out.generated_text = choice["message"]["content"] if chat else choice["text"]
                out.output_tokens = data["usage"]["completion_tokens"]
                out.success, out.ttft = True, -1.0
                out.latency = time.perf_counter() - start
                return out
            first = False
            for raw in response:
                line = raw.strip()
                if not line:
                    continue
                chunk = line.decode("utf-8").removeprefix("data: ")
                if chunk == "[DONE]":
                    continue
                now = time.perf_counter()
                data = json.loads(chunk)
                if choices := data.get("choices"):
                    choice = choices[0]
                    text = choice.get("delta", {}).get("content") if chat else choice.get("text")
                    if not first:
                        first, out.ttft = True, now - start
                    else:
                        out.itl.append(now - recent)
                    recent = now
                    out.generated_text += text or ""
                    text_chunks += bool(text)
                elif usage := data.get("usage"):
                    out.output_tokens = int(usage.get("completion_tokens") or 0)
                if chat:
                    recent = now
            out.success = first or chat
            if not out.success:
                out.error = "Never received a valid chunk to calculate TTFT."
            out.output_tokens = out.output_tokens or text_chunks
            out.latency = recent - start
    except urllib.error.HTTPError as error:
        print(f"HTTP Error {error.code}: {error.reason}")
        out.error = str(error.reason or "")
    except Exception as error:  # as the real client: any failure is this request's
        out.error = "".join(traceback.format_exception(error))
        out.exception_type = type(error).__name__
    return out


# ---------------------------------------------------------------- the run


def percentile(values: Sequence[float], p: float) -> float:
    """numpy.percentile's default (linear interpolation); [0] when empty, as the real
    client's `values or 0`."""
    xs = sorted(values) or [0.0]
    pos = (len(xs) - 1) * p / 100
    low, high = math.floor(pos), math.ceil(pos)
    return xs[low] + (xs[high] - xs[low]) * (pos - low)


def stats_ms(values: Sequence[float], percentiles: Sequence[float]) -> dict[str, float]:
    xs = list(values) or [0.0]
    out = {
        "mean": statistics.fmean(xs) * 1000,
        "median": statistics.median(xs) * 1000,
        "std": statistics.pstdev(xs) * 1000,
    }
    for p in percentiles:
        word = str(int(p)) if int(p) == p else str(p)
        out[f"p{word}"] = percentile(xs, p) * 1000
    return out


def parse_goodput(pairs: Sequence[str] | None) -> dict[str, float]:
    slo: dict[str, float] = {}
    for pair in pairs or ():
        try:
            name, value = pair.split(":")
            slo[name] = float(value)
        except ValueError:
            raise Refused(
                "Invalid format found for service level objectives. Specify service level "
                'objectives for goodput as "KEY:VALUE" pairs, where the key is a metric name, '
                "and the value is a number in milliseconds."
            ) from None
        if name not in GOODPUT_METRICS:
            raise Refused(
                f"Invalid metric name found, {name}: {slo[name]}. The service level objective "
                f"name should be one of {list(GOODPUT_METRICS)}. "
            )
        if slo[name] < 0:
            raise Refused(
                f"Invalid value found, {name}: {slo[name]}. The service level objective "
                "value should be non-negative."
            )
    return slo


def benchmark(
    args: argparse.Namespace, samples: list[Sample], api_url: str, base_url: str
) -> dict[str, Any]:
    """The run, the printed summary and the result fields (the real `benchmark`)."""
    chat = args.backend == "openai-chat"
    extra: dict[str, Any] = {
        k: v
        for k, v in {
            "top_p": args.top_p,
            "top_k": args.top_k,
            "min_p": args.min_p,
            "temperature": args.temperature,
        }.items()
        if v is not None
    }
    extra.setdefault("temperature", 0.0)
    goodput = parse_goodput(args.goodput)

    def one(url: str, sample: Sample) -> Output:
        return send(url, payload(args, sample, extra), sample.prompt_len, chat)

    if args.no_test_input:
        print("Skipping initial test run. Starting main benchmark run...")
    else:
        print("Starting initial single prompt test run...")
        test = one(api_url, samples[0])
        if not test.success:
            raise Refused(
                "Initial test run failed - Please make sure benchmark arguments are correctly "
                f"specified. Error: {test.error}"
            )
        print("Initial test run completed. Starting main benchmark run...")
    if args.profile:
        print("Starting profiler...")
        if one(base_url + "/start_profile", samples[0]).success:
            print("Profiler started")
    if args.burstiness <= 0:
        raise Refused(f"A positive burstiness factor is expected, but given {args.burstiness}.")
    distribution = "Poisson process" if args.burstiness == 1.0 else "Gamma distribution"
    print(f"Traffic request rate: {args.request_rate}")
    print(f"Burstiness factor: {args.burstiness} ({distribution})")
    print(f"Maximum request concurrency: {args.max_concurrency}")

    rng = random.Random(args.seed)
    theta = 1.0 / (args.request_rate * args.burstiness)
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=args.max_concurrency or len(samples)) as pool:
        futures = []
        for sample in samples:
            futures.append(pool.submit(one, api_url, sample))
            if args.request_rate != float("inf"):
                time.sleep(rng.gammavariate(args.burstiness, theta))
        outputs = [f.result() for f in futures]
    if args.profile:
        print("Stopping profiler...")
        if one(base_url + "/stop_profile", samples[0]).success:
            print("Profiler stopped")
    duration = time.perf_counter() - start
    return report(args, samples, outputs, duration, goodput)


def report(
    args: argparse.Namespace,
    samples: list[Sample],
    outputs: list[Output],
    duration: float,
    goodput: dict[str, float],
) -> dict[str, Any]:
    """The real `calculate_metrics` and the summary it prints."""
    output_lens: list[int] = []
    total_input = completed = 0
    itls: list[float] = []
    tpots: list[float] = []
    all_tpots: list[float] = []
    ttfts: list[float] = []
    e2els: list[float] = []
    per_user: list[float] = []
    errors: dict[str, int] = {}
    for sample, out in zip(samples, outputs, strict=True):
        if out.exception_type:
            errors[out.exception_type] = errors.get(out.exception_type, 0) + 1
        if not out.success:
            output_lens.append(0)
            continue
        n = out.output_tokens
        output_lens.append(n)
        total_input += sample.prompt_len
        tpot = (out.latency - out.ttft) / (n - 1) if n > 1 else 0.0
        if n > 1:
            tpots.append(tpot)
        all_tpots.append(tpot)
        itls += out.itl
        ttfts.append(out.ttft)
        e2els.append(out.latency)
        per_user.append(n / out.latency if out.latency > 0 else 0.0)
        completed += 1
    for kind, count in errors.items():
        print(f"Error type: {kind}, Count: {count} requests")
    print(f"Total failed requests: {sum(errors.values())}")
    good = 0
    if goodput:
        series = {"ttft": ttfts, "tpot": all_tpots, "e2el": e2els}
        chosen = [(goodput[k] / 1000, series[k]) for k in GOODPUT_METRICS if k in goodput]
        for request in zip(*(s for _, s in chosen), strict=True):
            good += all(slo >= v for (slo, _), v in zip(chosen, request, strict=True))
    total_output = sum(output_lens)
    user_throughput = statistics.fmean(per_user) if per_user else 0.0
    percentiles = [float(p) for p in args.metric_percentiles.split(",")]
    selected = args.percentile_metrics.split(",")
    series_of = {"ttft": ttfts, "tpot": tpots, "itl": itls, "e2el": e2els}

    def line(label: str, value: float | int, fmt: str = "") -> None:
        print(f"{label:<40} {value:<10{fmt}}")

    print("{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=50, c="="))
    line("Total requests:", len(outputs))
    line("Successful requests:", completed)
    line("Failed requests:", len(outputs) - completed)
    line("Benchmark duration (s):", duration, ".2f")
    line("Total input tokens:", total_input)
    line("Total generated tokens:", total_output)
    line("Request throughput (req/s):", completed / duration, ".2f")
    if goodput:
        line("Request goodput (req/s):", good / duration, ".2f")
    line("Output token throughput (tok/s):", total_output / duration, ".2f")
    line("Total Token throughput (tok/s):", (total_input + total_output) / duration, ".2f")
    line("User throughput (tok/s):", user_throughput, ".2f")
    if len(outputs) > completed:
        print("=======================!FAILED REQUESTS!=======================")
        print(f"Total failed requests: {len(outputs) - completed}")
        print("=====================!CHECK LOG FOR ERRORS!====================")
    result: dict[str, Any] = {
        "duration": duration,
        "completed": completed,
        "total_input_tokens": total_input,
        "total_output_tokens": total_output,
        "request_throughput": completed / duration,
        "request_goodput:": good / duration if goodput else None,
        "output_throughput": total_output / duration,
        "total_token_throughput": (total_input + total_output) / duration,
        "user_throughput": user_throughput,
        "avg_decoded_tokens_per_iter": 0.0,
        "input_lens": [o.prompt_len for o in outputs],
        "output_lens": output_lens,
        "ttfts": [o.ttft for o in outputs],
        "itls": [o.itl for o in outputs],
        "generated_texts": [o.generated_text for o in outputs],
        "errors": [o.error for o in outputs],
    }
    for metric, name, header in METRICS:
        if metric not in selected:
            continue
        print("{s:{c}^{n}}".format(s=header, n=50, c="-"))
        values = stats_ms(series_of[metric], percentiles)
        line(f"Mean {name} (ms):", values["mean"], ".2f")
        line(f"Median {name} (ms):", values["median"], ".2f")
        for key, value in values.items():
            result[f"{key}_{metric}_ms"] = value
            if key.startswith("p"):
                line(f"P{key[1:]} {name} (ms):", value, ".2f")
    print("=" * 50)
    return result


def save(args: argparse.Namespace, run: dict[str, Any]) -> str:
    """The result JSON as the real client writes it; returns its path."""
    now = datetime.now().strftime("%Y%m%d-%H%M%S")
    tokenizer_id = args.tokenizer if args.tokenizer is not None else args.model
    doc: dict[str, Any] = {
        "date": now,
        "backend": args.backend,
        "model_id": args.model,
        "tokenizer_id": tokenizer_id,
        "num_prompts": args.num_prompts,
    }
    for item in args.metadata or ():
        if "=" not in item:
            raise Refused("Invalid metadata format. Please use KEY=VALUE format.")
        parts = item.split("=")
        doc[parts[0].strip()] = parts[1].strip()
    doc.update(run)
    if not args.save_detailed:
        for key in ("input_lens", "output_lens", "ttfts", "itls", "generated_texts", "errors"):
            doc.pop(key, None)
    rate = args.request_rate
    doc["request_rate"] = rate if rate < float("inf") else "inf"
    doc["burstiness"] = args.burstiness
    doc["max_concurrency"] = args.max_concurrency
    limit = "" if args.max_concurrency is None else f"-concurrency{args.max_concurrency}"
    name = f"{args.backend}-{rate}qps{limit}-{args.model.split('/')[-1]}-{now}.json"
    name = args.result_filename or name
    if args.result_dir:
        name = os.path.join(args.result_dir, name)
    with open(name, "w", encoding="utf-8") as stream:
        json.dump(doc, stream)
    return name


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    print("benchmark_serving: k2provision stand-in of TensorRT-LLM's client (lab only)")
    print(args)
    if args.backend == "openai-chat":
        args.endpoint = "/v1/chat/completions"
    base_url = args.base_url if args.base_url is not None else f"http://{args.host}:{args.port}"
    try:
        samples = sample_requests(args)
        run = benchmark(args, samples, base_url + args.endpoint, base_url)
        if args.save_result:
            save(args, run)
    except Refused as refused:
        print(f"error: {refused}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
