"""Stand-in `tensorrt_llm` package (a test double; lab image only).

It carries one program: a stand-in of TensorRT-LLM's serving benchmark client,
`python3 -m tensorrt_llm.serve.scripts.benchmark_serving`, the client `k2provision bench`
runs for TensorRT-LLM plans. The real client ships in the tensorrt_llm wheel, which is not on
PyPI (PyPI holds only a stub sdist that fetches the wheel from pypi.nvidia.com), and the lab's
network reaches PyPI alone. Nothing else of TensorRT-LLM is here: no engine, no LLM API.
"""
