"""Loading models: GGUF and HF folders, their configs, and the weight caches."""
