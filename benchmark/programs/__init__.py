"""Program-level benchmark suite: `python -m benchmark.programs [--quick]` from the repository root."""
