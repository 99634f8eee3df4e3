"""SGLang's hosted-API backends and server-argument class: the names exist, so a ported program imports, and
using one says what to use instead. radixlang runs programs on its own runtime (`Runtime`, `Engine`) or on a
radixlang / SGLang server (`RuntimeEndpoint`); SGLang's OpenAI-style backends drive a hosted model through
chat completions (no KV reuse, selects by logit bias), which radixlang does not reimplement."""
from __future__ import annotations

import importlib.metadata

_INSTEAD = ("use rl.Runtime(model_path) in process, or rl.RuntimeEndpoint(url) for a `radixlang serve` "
            "(or SGLang) server")


def _unsupported(name: str, instead: str = _INSTEAD) -> type:
    def __init__(self: object, *args: object, **kwargs: object) -> None:
        raise NotImplementedError(f"sgl.{name} is not supported by radixlang: {instead}")

    return type(name, (), {"__init__": __init__, "__doc__": f"SGLang's {name}: not supported; {instead}.",
                           "__module__": __name__})


OpenAI = _unsupported("OpenAI")
Anthropic = _unsupported("Anthropic")
LiteLLM = _unsupported("LiteLLM")
VertexAI = _unsupported("VertexAI")
Crusoe = _unsupported("Crusoe")
ServerArgs = _unsupported("ServerArgs", "pass the options to rl.Engine(...) / rl.Runtime(...), or to "
                          "`radixlang serve` (see --help)")


def version() -> str:
    try:
        return importlib.metadata.version("radixlang")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"
