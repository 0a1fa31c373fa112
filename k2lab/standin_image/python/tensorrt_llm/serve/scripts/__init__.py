"""Stand-in `tensorrt_llm.serve.scripts` (a test double; lab image only): `benchmark_serving`."""
