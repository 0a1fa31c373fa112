"""Stand-in `sglang` package (test double for SGLang's GPU kernels; lab image only)."""
