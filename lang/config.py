"""The language's settings: the one place they live."""
from __future__ import annotations

# gen(dtype=...) constrains the output with these regexes (the variable keeps the generated text)
DTYPE_REGEXES = {
    "int": r"[-+]?[0-9]+",
    "float": r"[-+]?[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?",
    "bool": r"(True|False)",
    "str": r'"[^"\n]*"',
}
MAX_FORK_SIZE = 256  # most children one fork may create
RUN_BATCH_AUTO_THREADS = 64  # run_batch(num_threads="auto"): min(this, batch size)
SELECT_HEAL_WINDOW = 8  # endpoint select: prefix tokens re-scored to find where healing starts
HTTP_TIMEOUT_S = 600.0  # endpoint client: longest wait for a server response before giving up
