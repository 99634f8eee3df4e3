"""Benchmark scripts (run them as files: `python benchmark/radix_cache.py`); importable as `radixlang.benchmark`."""
