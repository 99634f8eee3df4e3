"""The radixlang language: programs of gen / select / fork / image / roles, traced to IR, run on a backend."""
from .api import (
                  assistant,
                  assistant_begin,
                  assistant_end,
                  flush_cache,
                  gen,
                  gen_int,
                  gen_string,
                  get_server_info,
                  image,
                  select,
                  separate_reasoning,
                  system,
                  system_begin,
                  system_end,
                  user,
                  user_begin,
                  user_end,
                  video,
)
from .backend import Backend, GenDelta, StateView
from .choices import (
                  ChoicesDecision,
                  ChoicesSamplingMethod,
                  greedy_token_selection,
                  token_length_normalized,
                  unconditional_likelihood_normalized,
)
from .default_backend import set_default_backend
from .endpoint import Endpoint, RuntimeEndpoint
from .engine_backend import EngineBackend, Runtime
from .executor import ProgramCancelled, ProgramEvent
from .global_config import global_config
from .hosted import Anthropic, Crusoe, LiteLLM, OpenAI, ServerArgs, VertexAI, version
from .interpreter import interpret, run_ir
from .ir import IR_VERSION, TraceError
from .ir_json import ProgramIR
from .program import Program, function, program
from .state import ProgramState, ProgramStateGroup
from .tools import Tool, call_text, tool, tool_results, tools_prompt

__version__ = version()

__all__ = [
    "Anthropic", "Crusoe", "LiteLLM", "OpenAI", "ServerArgs", "VertexAI", "__version__",
    "Tool", "call_text", "tool", "tool_results", "tools_prompt",
    "Backend", "ChoicesDecision", "ChoicesSamplingMethod", "Endpoint", "EngineBackend", "GenDelta", "IR_VERSION",
    "Program", "ProgramCancelled", "ProgramEvent", "ProgramIR", "ProgramState", "ProgramStateGroup", "Runtime",
    "RuntimeEndpoint", "StateView", "TraceError", "assistant", "assistant_begin", "assistant_end", "flush_cache",
    "function", "gen", "gen_int", "gen_string", "get_server_info", "global_config", "greedy_token_selection", "image",
    "interpret", "program", "run_ir",
    "select", "separate_reasoning", "set_default_backend", "system", "system_begin", "system_end", "token_length_normalized",
    "unconditional_likelihood_normalized", "user", "user_begin", "user_end", "video",
]
