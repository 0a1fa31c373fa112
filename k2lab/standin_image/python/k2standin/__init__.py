"""k2provision's stand-in engines: a test double for the inference engines' GPU kernels.

Installed only into the lab image `localhost/k2-standin:lab`, which k2provision's plan uses
instead of the real engine images only when the inventory sets `k2_lab=true` (hosts without
GPUs). Each entry point takes the real engine's command line, checks what this deployment
needs from it, records it under /run/k2-standin and serves the HTTP endpoints the health
gates and the verify role use. See k2lab/standin_image/README.md.
"""
