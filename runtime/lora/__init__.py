"""Multi-LoRA serving: PEFT adapters loaded beside the base model, many in one batch (docs/lora.md).

This module stays free of torch: the request validation imports its error."""
from __future__ import annotations


class UnknownAdapter(LookupError):
    """A request names an adapter that is not loaded (the server's 404)."""

    def __init__(self, name: str, loaded: list[str]):
        super().__init__(f"LoRA adapter {name!r} is not loaded; loaded: {', '.join(sorted(loaded)) or 'none'}")
        self.name = name
