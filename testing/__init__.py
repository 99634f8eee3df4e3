"""Test fixtures that users and benchmarks may call too: random-weight checkpoints of a given shape, saved
in today's formats (`random_llama`: Llama-family folders with SmolLM2's tokenizer; `random_llava`: LLaVA
folders). The runtime never imports this package."""
