"""Speculative decoding: drafters propose a token tree, the target verifies it in one forward pass."""
