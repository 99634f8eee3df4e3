"""The one folder radixlang keeps its caches in: converted weights, the CPU kernels' builds, inductor's
artefacts and measured CPU crossovers. A leaf below every layer, so kernels/ and runtime/ both read it."""
from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """RADIXLANG_CACHE_DIR, else $XDG_CACHE_HOME/radixlang, else ~/.cache/radixlang."""
    explicit = os.environ.get("RADIXLANG_CACHE_DIR")
    if explicit:
        return Path(explicit)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "radixlang"
