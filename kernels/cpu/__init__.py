"""CPU kernels: the AVX-512/AVX2 block kernel for GGUF low-bit weights, the oneDNN-packed dense matmul."""
