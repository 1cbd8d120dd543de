"""Benchmarks: mesh overhead against one process (`python -m dualpath.bench.overhead`)."""
