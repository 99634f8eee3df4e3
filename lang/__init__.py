"""The radixlang language: programs of gen / select / fork / image / roles, traced to IR, run on a backend."""
from .api import (assistant, assistant_begin, assistant_end, flush_cache, gen, gen_int, gen_string, image, select,
                  system, system_begin, system_end, user, user_begin, user_end)
from .backend import Backend, GenDelta, StateView
from .default_backend import set_default_backend
from .choices import (ChoicesDecision, ChoicesSamplingMethod, greedy_token_selection, token_length_normalized,
                      unconditional_likelihood_normalized)
from .endpoint import Endpoint, RuntimeEndpoint
from .engine_backend import EngineBackend, Runtime
from .interpreter import interpret, run_ir
from .ir import IR_VERSION, ProgramIR, TraceError
from .program import Program, function, program
from .executor import ProgramCancelled, ProgramEvent
from .state import ProgramState, ProgramStateGroup

__all__ = [
    "Backend", "ChoicesDecision", "ChoicesSamplingMethod", "Endpoint", "EngineBackend", "GenDelta", "IR_VERSION",
    "Program", "ProgramCancelled", "ProgramEvent", "ProgramIR", "ProgramState", "ProgramStateGroup", "Runtime",
    "RuntimeEndpoint", "StateView", "TraceError", "assistant", "assistant_begin", "assistant_end", "flush_cache",
    "function", "gen", "gen_int", "gen_string", "greedy_token_selection", "image", "interpret", "program", "run_ir",
    "select", "set_default_backend", "system", "system_begin", "system_end", "token_length_normalized",
    "unconditional_likelihood_normalized", "user", "user_begin", "user_end",
]
