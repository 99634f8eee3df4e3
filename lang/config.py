"""The language's settings: the one place they live."""
from __future__ import annotations

# SGLang's `sglang.lang.ir` regexes (programs import them). A number may end in spaces or newlines, which
# gen(dtype=int / float) also stops at, so the model ends it the way it likes ("24 hours" -> "24").
REGEX_INT = r"[-+]?[0-9]+[ \n]*"
REGEX_FLOAT = r"[-+]?[0-9]*\.?[0-9]+([eE][-+]?[0-9]+)?[ \n]*"  # SGLang's, plus an exponent
REGEX_BOOL = r"(True|False)"
REGEX_STR = r"\"[\w\d\s]*\""
# gen(dtype=...) constrains the output with these regexes (the variable keeps the generated text)
DTYPE_REGEXES = {"int": REGEX_INT, "float": REGEX_FLOAT, "bool": REGEX_BOOL, "str": REGEX_STR}
DTYPE_STOPS = {"int": [" ", "\n"], "float": [" ", "\n"]}  # as SGLang's RuntimeEndpoint adds them
MAX_FORK_SIZE = 256  # most children one fork may create
RUN_BATCH_AUTO_THREADS = 64  # run_batch(num_threads="auto"): min(this, batch size)
SELECT_HEAL_WINDOW = 8  # endpoint select: prefix tokens re-scored to find where healing starts
HTTP_TIMEOUT_S = 600.0  # endpoint client: longest wait for a server response before giving up
