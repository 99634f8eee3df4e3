"""`radixlang` command line: generate text with the engine, or serve it over HTTP."""
from __future__ import annotations

import argparse
import dataclasses
import gc
import sys
from pathlib import Path
from typing import Any, Sequence

from ..runtime.config import EngineConfig
from .auth import ADMIN_KEY_ENV, KEY_ENV, AuthConfig, warn_if_open
from .config import DEFAULT_HOST, DEFAULT_PORT, GRACEFUL_SHUTDOWN_S
from .limits import ServerLimits

_ARG_TYPES = {"str": str, "int": int, "float": float}
# extra spellings of an engine option's flag (SGLang's)
_FLAG_ALIASES = {"tp_size": ("--tp",), "ep_size": ("--ep",), "enable_dp_attention": ("--dp-attention",)}


class _Parser(argparse.ArgumentParser):
    """An unknown option is reported with the usage of the command it was given to (`serve`'s), not the
    top-level one: argparse leaves a subcommand's leftovers to the parent, whose error prints its own usage."""

    def parse_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                   namespace: argparse.Namespace | None = None) -> argparse.Namespace:
        parsed, extra = self.parse_known_args(args, namespace)
        if extra:
            owner: argparse.ArgumentParser = getattr(parsed, "command_parser", self)
            owner.error(f"unrecognized arguments: {' '.join(extra)}")
        return parsed


def field_flags(f: dataclasses.Field) -> tuple[str, ...]:
    """The command-line spellings of an option field: --kv-cache-tokens, and SGLang's aliases (--tp)."""
    return ("--" + f.name.replace("_", "-"), *_FLAG_ALIASES.get(f.name, ()))


def field_help(f: dataclasses.Field, default: object = dataclasses.MISSING) -> str:
    """An option field's description, from its declaration (runtime/config.option), with its default."""
    default = f.default if default is dataclasses.MISSING else default
    return f"{f.metadata['help']} (default: {shown_default(default)})".replace("%", "%%")  # argparse formats with %


def shown_default(value: object) -> str:
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


def _add_field(group: argparse._ArgumentGroup, f: dataclasses.Field, default: object) -> None:
    base = str(f.type).split("|")[0].strip()
    choices = f.metadata.get("choices") or None
    if base == "bool":
        group.add_argument(*field_flags(f), action="store_true", default=default, help=field_help(f))
    elif base == "list[str]":  # --lora-paths a=DIR b=DIR
        group.add_argument(*field_flags(f), nargs="+", type=str, default=default, help=field_help(f))
    else:
        group.add_argument(*field_flags(f), type=_ARG_TYPES[base], default=default, choices=choices,
                           help=field_help(f))


def _engine_fields(skip: Sequence[str]) -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(EngineConfig) if f.name != "model" and f.name not in skip]


def _add_engine_options(parser: argparse.ArgumentParser, skip: Sequence[str] = ()) -> None:
    """One flag per EngineConfig field (--kv-cache-tokens, --schedule-policy, ...), described by the field's
    declaration; unset flags leave the engine's own default. `skip`: fields whose flag the command uses otherwise."""
    parser.add_argument("--model", default=None, help="GGUF file or Hugging Face folder, a local path (a hub id "
                        "needs `huggingface-cli download ID --local-dir DIR` first); default: SmolLM2-135M-Instruct")
    parser.set_defaults(engine_skip=tuple(skip))
    group = parser.add_argument_group("engine options")
    for f in _engine_fields(skip):
        _add_field(group, f, None)


def _add_limit_options(parser: argparse.ArgumentParser) -> None:
    """One flag per ServerLimits field (--max-body-bytes, --max-prompts, ...)."""
    group = parser.add_argument_group("request limits (a request over one is refused with a 4xx naming it)")
    for f in dataclasses.fields(ServerLimits):
        _add_field(group, f, f.default)


def _limits(args: argparse.Namespace) -> ServerLimits:
    limits = ServerLimits(**{f.name: getattr(args, f.name) for f in dataclasses.fields(ServerLimits)})
    limits.validate()
    return limits


def _engine_options(args: argparse.Namespace) -> dict[str, Any]:
    names = (f.name for f in _engine_fields(args.engine_skip))
    return {name: getattr(args, name) for name in names if getattr(args, name) is not None}


def _check_model(model: str | None) -> None:
    """A missing --model fails here, before an engine starts, with what to do (a hub id: download it first)."""
    from ..runtime.models.loading.loader import missing_model_message

    if model is not None and not Path(model).exists():
        raise FileNotFoundError(missing_model_message(model))


def _generate(args: argparse.Namespace) -> int:
    from ..runtime.engine import Engine

    _check_model(args.model)

    with Engine(model=args.model, **_engine_options(args)) as engine:
        prompt = args.prompt
        if args.chat:
            prompt = engine.tokenizer.apply_chat_template([{"role": "user", "content": prompt}])
        params = {"max_new_tokens": args.max_tokens, "temperature": args.temperature}
        if args.seed is not None:
            params["seed"] = args.seed
        for chunk in engine.stream(prompt, params):
            sys.stdout.write(chunk.text)
            sys.stdout.flush()
        sys.stdout.write("\n")
    # the interpreter's exit would collect garbage over every object torch made (~0.5 s on a 2-core VM);
    # frozen, they are left to the process's end. The engine is shut down; a weight-cache write still under
    # way finishes first (the interpreter joins its thread)
    gc.freeze()
    return 0


def _auth(args: argparse.Namespace) -> AuthConfig:
    auth = AuthConfig.from_options(args.api_key, args.api_keys_file, args.admin_api_key,
                                   args.max_requests_per_tenant)
    warn_if_open(args.host, auth)
    return auth


def _serve(args: argparse.Namespace) -> int:
    from ..runtime.engine import Engine
    from .launch import serve

    limits = _limits(args)  # a bad limit fails before the model loads
    auth = _auth(args)  # ... and so do a bad key or keys file
    if args.dp is not None and args.enable_dp_attention:
        _dp_attention_ranks(args)
    elif args.dp is not None:
        return _serve_fleet(args, limits, auth)
    # a server lives long enough to repay a compile, which runs in the background: auto means on here
    options = {"compile_layers": True} | _engine_options(args)
    _check_model(args.model)
    with Engine(model=args.model, **options) as engine:
        # a full pass of the cyclic garbage collector walks every object the process holds: after the engine
        # loads, ~190k of torch's, the model's and the tokenizer's, ~60 ms on a 2-core VM, a stall of every
        # request whenever Python starts one (and inside a constraint's compile or mask, where they are
        # timed). They live as long as the server: frozen, the collector skips them (vLLM's engine does so)
        gc.collect()
        gc.freeze()
        serve(engine, args.host, args.port, served_model_name=args.served_model_name,
              grace_s=args.graceful_timeout, log_level=args.log_level, limits=limits,
              incremental_streaming_output=args.incremental_streaming_output, log_requests=args.log_requests,
              auth=auth, ssl_keyfile=args.ssl_keyfile, ssl_certfile=args.ssl_certfile)
    return 0


def _dp_attention_ranks(args: argparse.Namespace) -> None:
    """SGLang's `--tp N --dp N --enable-dp-attention`: one engine whose N ranks each run their own requests
    (not a fleet of N engines, which --dp alone starts)."""
    if args.dp != (args.tp_size or 1):
        raise ValueError(f"--dp with --enable-dp-attention counts the attention replicas, one per rank: it must "
                         f"equal --tp ({args.tp_size or 1}), got {args.dp}")


def _serve_fleet(args: argparse.Namespace, limits: ServerLimits, auth: AuthConfig) -> int:
    """`serve --dp N`: N `radixlang serve` workers with these options behind SGLang's router."""
    from .fleet import FleetSpec, require_router, serve_fleet, worker_flags

    require_router()  # says how to install it
    _check_model(args.model)  # here, not in each of N workers
    options = {"model": args.model, "served_model_name": args.served_model_name,
               "incremental_streaming_output": args.incremental_streaming_output, "log_requests": args.log_requests,
               **_engine_options(args),
               **dataclasses.asdict(limits), "max_requests_per_tenant": args.max_requests_per_tenant or None}
    spec = FleetSpec(host=args.host, port=args.port, dp=args.dp, worker_args=list(worker_flags(options)),
                     policy=args.router_policy, threads_per_worker=args.threads_per_worker,
                     grace_s=args.graceful_timeout, router_args=args.router_arg, log_level=args.log_level,
                     auth=auth, ssl_keyfile=args.ssl_keyfile, ssl_certfile=args.ssl_certfile)
    return serve_fleet(spec)


def _add_security_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("access (docs/security.md): without a key the server is open to all")
    group.add_argument("--api-key", action="append", default=[], metavar="KEY",
                       help="a key clients must send (Authorization: Bearer KEY, or x-api-key: KEY); repeatable, "
                            f"each its own tenant with its own cache; also read from ${KEY_ENV}")
    group.add_argument("--api-keys-file", default=None, metavar="FILE",
                       help="keys, one a line: `KEY` or `KEY TENANT` (keys of one tenant share its cache)")
    group.add_argument("--admin-api-key", default=None, metavar="KEY",
                       help="the key of the routes that act on the whole server (/flush_cache, profiling, "
                            f"abort_all, worker loads); also read from ${ADMIN_KEY_ENV}")
    group.add_argument("--max-requests-per-tenant", type=int, default=0, metavar="N",
                       help="requests one key may have in flight; past it a 429 with Retry-After (default: 0, no cap)")
    group.add_argument("--ssl-keyfile", default=None, help="serve HTTPS: the private key (PEM)")
    group.add_argument("--ssl-certfile", default=None, help="serve HTTPS: the certificate chain (PEM)")


def _add_fleet_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("data parallel (SGLang's router in front of N engines; "
                                      "pip install sglang-router)")
    group.add_argument("--dp", type=int, default=None, help="engine processes behind the router on --port "
                       "(each on a free port, with its share of the threads, or one GPU each)")
    group.add_argument("--router-policy", default="cache_aware",
                       choices=["cache_aware", "round_robin", "random", "power_of_two"],
                       help="how the router picks a worker: cache_aware (the longest cached prefix, unless the "
                            "load is uneven), round_robin, random, power_of_two (the less loaded of two) "
                            "(default: cache_aware)")
    group.add_argument("--threads-per-worker", type=int, default=None,
                       help="CPU threads of each engine (default: the cores split evenly)")
    group.add_argument("--router-arg", action="append", default=[],
                       help="an extra sglang-router option, passed as is (repeatable; e.g. --router-arg=--cache-threshold=0.5)")


def _quantize(args: argparse.Namespace) -> int:
    from ..runtime.quantize.driver import QuantizeOptions, quantize

    tuned = {name: getattr(args, name) for name in ("act_order", "calib_tokens", "asymmetric")
             if getattr(args, name) is not None}  # unset: QuantizeOptions' default
    opts = QuantizeOptions(method=args.method, bits=args.bits, group_size=args.group_size,
                           static_groups=args.static_groups, sym=args.sym, clip_search=args.clip_search,
                           percdamp=args.percdamp, alpha=args.alpha, calib=args.calibration, threads=args.threads,
                           fp_down=args.fp_down, rotate_down=args.rotate_down, rotate=args.rotate, **tuned)
    model = None if args.model == "default" else args.model
    _check_model(model)
    quantize(model, args.out, opts)
    return 0


def _percdamp(value: str) -> float | None:
    return None if value == "auto" else float(value)


def _alpha(value: str) -> float | None:
    return None if value == "search" else float(value)


def _add_quantize_command(sub) -> None:
    q = sub.add_parser("quantize", help="quantize MODEL (GGUF or HF folder) into an HF folder OUT, on CPU")
    q.add_argument("model", help="GGUF file or HF folder ('default': SmolLM2-135M-Instruct)")
    q.add_argument("out", help="folder to write (config.json with quantization_config, safetensors, tokenizer)")
    q.add_argument("--method", default="gptq", choices=["gptq", "awq", "rtn", "smoothquant"],
                   help="gptq / rtn: weight-only int4 or int8, GPTQ format; awq: int4, AWQ format; "
                        "smoothquant: W8A8 int8")
    q.add_argument("--bits", type=int, default=4, choices=[4, 8], help="bits per weight (default: 4)")
    q.add_argument("--group-size", type=int, default=128, help="-1, 32, 64 or 128 (default: 128)")
    q.add_argument("--act-order", "--desc-act", dest="act_order", action=argparse.BooleanOptionalAction,
                   default=None, help="GPTQ: round columns by descending Hessian diagonal (default: on)")
    q.add_argument("--static-groups", action="store_true",
                   help="GPTQ with --act-order: groups of consecutive inputs (no input permutation at load)")
    q.add_argument("--sym", action="store_true", help="symmetric weight codes (default: asymmetric)")
    q.add_argument("--clip-search", action=argparse.BooleanOptionalAction, default=True,
                   help="GPTQ / AWQ: shrink each group's range to the one with the least output error (default: on)")
    q.add_argument("--percdamp", type=_percdamp, default=0.1,
                   help="GPTQ dampening, fraction of mean diag(H) (default 0.1), or 'auto': picked per linear "
                        "from 0.01, 0.1, 1 on held-out calibration samples")
    q.add_argument("--alpha", type=_alpha, default=None,
                   help="SmoothQuant migration strength for every layer, or 'search' (the default): each layer's "
                        "own, the one with the least simulated W8A8 error of that layer's output")
    q.add_argument("--fp-down", type=int, default=0,
                   help="SmoothQuant: keep the down_proj of this many layers (where its W8A8 error weighs most) "
                        "in fp (default: 0)")
    q.add_argument("--rotate-down", action=argparse.BooleanOptionalAction, default=True,
                   help="SmoothQuant: rotate down_proj's input by a Hadamard matrix at run time, its weights "
                        "offline (loads in radixlang only; default: on)")
    q.add_argument("--rotate", action=argparse.BooleanOptionalAction, default=False,
                   help="GPTQ / AWQ: rotate the model by randomized Hadamard matrices before rounding (offline, the "
                        "same function; the LM head is untied from the embedding; default: off, worse on SmolLM2)")
    q.add_argument("--asymmetric", type=float, default=None,
                   help="GPTQ: GPTAQ's asymmetric calibration, the fraction (0-1) of the way from each linear's "
                        "weights to the fit of the fp model's outputs on the quantized model's inputs "
                        "(default 0.5; 0: plain GPTQ)")
    q.add_argument("--calibration", "--calib", dest="calibration", default=None,
                   help="calibration text: 'prose' (GPTQ's default: ~21k tokens shipped with radixlang: fiction, "
                        "letters, news, how-to, chat, dialogue, reviews, tables), 'builtin' (the other methods' "
                        "default: ~2k tokens shipped), 'mixed' "
                        "(builtin plus Python's documentation and docstrings and the READMEs and licences of the "
                        "installed packages), 'python', or a file of your own (plain text, or .jsonl with a \"text\" "
                        "field)")
    q.add_argument("--calib-tokens", type=int, default=None, help="calibration tokens at most (default 32768)")
    q.add_argument("--threads", type=int, default=1,
                   help="torch threads for the calibration passes (default 1: fastest on a busy machine)")
    q.set_defaults(func=_quantize)


def _cache(args: argparse.Namespace) -> int:
    from .. import cache_dir

    if args.cache_command in ("clear", "prune"):
        removed = cache_dir.clear(kinds=args.kind) if args.cache_command == "clear" else cache_dir.prune()
        print(f"removed {len(removed)} entries ({cache_dir.human_bytes(sum(e.bytes for e in removed))}) "
              f"from {cache_dir.cache_dir()}")
        return 0
    print(cache_dir.render_listing(cache_dir.entries()))
    return 0


def _add_cache_command(sub) -> None:
    c = sub.add_parser("cache", help="list or clear radixlang's cache folder (converted weights, compiled code, "
                                     "kernels): $RADIXLANG_CACHE_DIR, else ~/.cache/radixlang")
    actions = c.add_subparsers(dest="cache_command", required=True)
    actions.add_parser("ls", help="list the entries: kind, size, last use, name")
    actions.add_parser("prune", help="remove stale weight entries, then the least recently used ones over the "
                                     "bound (per model, twice its largest entry; or RADIXLANG_CACHE_MAX_BYTES for "
                                     "all together), as each write does")
    clear = actions.add_parser("clear", help="remove entries (every kind unless --kind is given)")
    clear.add_argument("--kind", action="append", choices=["weights", "compile", "kernels", "other"],
                       help="remove only entries of this kind (repeatable; default: all)")
    for p in (c, *actions.choices.values()):
        p.set_defaults(command_parser=p)
    c.set_defaults(func=_cache)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="radixlang", description="radixlang LLM runtime")
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="print a completion of PROMPT")
    gen.add_argument("prompt", help="the text to complete (with --chat: the user's message)")
    gen.add_argument("--max-tokens", type=int, default=128, help="tokens to generate at most (default: 128)")
    gen.add_argument("--temperature", type=float, default=0.0, help="sampling temperature; 0: greedy (default: 0)")
    gen.add_argument("--seed", type=int, default=None, help="sampling seed (default: the engine's --seed)")
    gen.add_argument("--chat", action="store_true", help="wrap PROMPT in the model's chat template")
    _add_engine_options(gen, skip=("seed",))
    gen.set_defaults(func=_generate)

    srv = sub.add_parser("serve", help="serve the engine over HTTP (native /generate and OpenAI /v1)")
    srv.add_argument("--host", default=DEFAULT_HOST, help=f"address to listen on (default: {DEFAULT_HOST}; "
                     "0.0.0.0: every interface)")
    srv.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port to listen on (default: {DEFAULT_PORT})")
    srv.add_argument("--served-model-name", default=None, help="model id in /v1 (default: the model's name)")
    srv.add_argument("--graceful-timeout", type=float, default=GRACEFUL_SHUTDOWN_S,
                     help="seconds requests in flight may still run on shutdown before they are aborted")
    srv.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"],
                     help="logging threshold: info shows the start-up banner, a step line every few seconds while "
                          "busy, and uvicorn's access lines (default: info)")
    srv.add_argument("--log-requests", action="store_true",
                     help="log each request's method, path and body (truncated) at info level (default: off)")
    srv.add_argument("--incremental-streaming-output", action="store_true",
                     help="as SGLang's: each /generate stream event carries only the text, output_ids and "
                          "logprobs new since the last one (default: all so far)")
    _add_limit_options(srv)
    _add_security_options(srv)
    _add_fleet_options(srv)
    _add_engine_options(srv)
    srv.set_defaults(func=_serve)
    _add_quantize_command(sub)
    _add_cache_command(sub)
    for command in sub.choices.values():  # an unknown option prints that command's usage (_Parser)
        command.set_defaults(command_parser=command)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
