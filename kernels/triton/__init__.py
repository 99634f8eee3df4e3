"""Triton kernels for CUDA GPUs (on a CPU-only machine the tests run them in Triton's interpreter)."""
