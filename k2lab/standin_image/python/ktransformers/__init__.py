"""Stand-in `ktransformers` package (test double for KTransformers' kernels; lab image only)."""
