"""Benchmarks (scripts, not tests) and what they share with the tests: the relay harness."""
