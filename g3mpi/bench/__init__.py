"""Benchmarks (side by side in one process; never timed tests)."""
