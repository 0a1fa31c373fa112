"""Stand-in `sglang_router` package (part of the SGLang test double; lab image only)."""
