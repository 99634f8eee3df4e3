"""`radixlang` command line: generate text with the engine."""
from __future__ import annotations

import argparse
import sys
from typing import Sequence


def _generate(args: argparse.Namespace) -> int:
    from ..engine import Engine

    with Engine(model=args.model, kv_cache_tokens=args.kv_cache_tokens) as engine:
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
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="radixlang", description="radixlang LLM runtime")
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="print a completion of PROMPT")
    gen.add_argument("prompt")
    gen.add_argument("--max-tokens", type=int, default=128)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--seed", type=int, default=None)
    gen.add_argument("--chat", action="store_true", help="wrap PROMPT in the model's chat template")
    gen.add_argument("--model", default=None, help="GGUF file or HF folder (default: SmolLM2-135M-Instruct)")
    gen.add_argument("--kv-cache-tokens", type=int, default=None)
    gen.set_defaults(func=_generate)
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
