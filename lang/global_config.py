"""SGLang's `sglang.global_config`: process-wide frontend settings, under SGLang's names."""
from __future__ import annotations

from typing import Any


class GlobalConfig:
    """What each setting does here:

    - default_backend: the backend `run` uses when none is passed (as `set_default_backend`);
    - verbosity: 2 prints each run's final text;
    - enable_precache_with_tracing: run_batch first caches the prefix every run starts with;
    - skip_special_tokens_in_output: False keeps special tokens in generated text;
    - spaces_between_special_tokens_in_out: no effect (fast tokenizers never put spaces between them);
    - enable_parallel_encoding: no effect (a `concate_and_append` join appends the forks' text, and the
      next request reuses their KV through the radix cache, so no KV is spliced and outputs stay exact).
    """

    # declared for the type checker: __init__ sets each flag through _FLAGS
    skip_special_tokens_in_output: bool
    spaces_between_special_tokens_in_out: bool
    enable_precache_with_tracing: bool
    enable_parallel_encoding: bool

    _FLAGS = ("skip_special_tokens_in_output", "spaces_between_special_tokens_in_out",
              "enable_precache_with_tracing", "enable_parallel_encoding")

    def __init__(self) -> None:
        # kept as set: lang/default_backend.py checks and wraps it where a run reads it (this module is a
        # leaf, so that gen_params and the backends can read the settings without an import cycle)
        self.default_backend: Any = None
        self.verbosity = 0
        for flag in self._FLAGS:
            setattr(self, flag, True)

    def __setattr__(self, name: str, value: object) -> None:
        if name == "default_backend":
            object.__setattr__(self, name, value)
            return
        if name == "verbosity" and (not isinstance(value, int) or isinstance(value, bool)):
            raise TypeError(f"global_config.verbosity must be an integer, got {value!r}")
        if name in self._FLAGS and not isinstance(value, bool):
            raise TypeError(f"global_config.{name} must be a boolean, got {value!r}")
        if name not in ("verbosity", *self._FLAGS):
            raise AttributeError(f"global_config has no setting {name!r}; its settings are "
                                 f"{['default_backend', 'verbosity', *self._FLAGS]}")
        object.__setattr__(self, name, value)


global_config = GlobalConfig()
