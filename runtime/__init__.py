"""The engine's runtime. Importing it first chooses how torch's OpenMP workers wait, from the machine's state,
before torch loads (openmp_policy.py); OPENMP_POLICY says what was chosen (None: torch was loaded already)."""
from .openmp_policy import apply as _apply_openmp_policy

OPENMP_POLICY = _apply_openmp_policy()
