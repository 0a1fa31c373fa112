"""Stand-in `ktransformers.server` package (lab image only)."""
