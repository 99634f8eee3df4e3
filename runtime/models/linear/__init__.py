"""Linear layers' weight paths: GGUF blocks, int8/int4, GPTQ/AWQ, W8A8, and which CPU path runs."""
