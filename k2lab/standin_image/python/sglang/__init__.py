"""Stand-in `sglang` package (test double for SGLang's GPU kernels; lab image only).

In the image that also carries SGLang's real benchmark client (`localhost/k2-standin:lab-client`,
built from k2lab/standin_client, which sets K2_STANDIN_SGLANG_CLIENT to the real package's
directory), a program of `sglang.benchmark` (`python3 -m sglang.benchmark.serving`, or the
`import sglang.benchmark.serving` check `k2provision bench` runs first) gets the real package:
this module puts that directory first on the path and hands the name `sglang` over to it.
Every other program, `python3 -m sglang.launch_server` above all, keeps the stand-in.
"""

import importlib
import os
import sys

_CLIENT = os.environ.get("K2_STANDIN_SGLANG_CLIENT", "")
if _CLIENT and any("sglang.benchmark" in arg for arg in sys.orig_argv):
    sys.path.insert(0, _CLIENT)
    del sys.modules[__name__]
    sys.modules[__name__] = importlib.import_module(__name__)
