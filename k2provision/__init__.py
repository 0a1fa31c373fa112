"""k2provision: inventory -> plan -> rendered launches -> provisioned, serving Kimi-K2 cluster."""

__version__ = "0.1.0"
