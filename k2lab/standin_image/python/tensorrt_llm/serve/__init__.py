"""Stand-in `tensorrt_llm.serve` (a test double; lab image only): only the benchmark client
under `scripts`, no OpenAI server (the stand-in trtllm-serve is `k2standin.trtllm`)."""
