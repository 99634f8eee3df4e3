"""Two tenants on one `radixlang serve` with API keys (docs/security.md): what one learns of the other, and
how much one slows the other. Both parts run over HTTP against an in-process server on SmolLM2-135M, the
clients in a process of their own (as a server's clients are: in its process they would slow its steps).

Leak: tenant A sends a 600-token prompt, then again; tenant B then sends A's exact prompt; and B sends a
fresh 600-token prompt (the cold reference). B must report 0 cached tokens and a time to first token like
the cold prompt's, while A's repeat is fully cached (all but the last token) and fast. Timings are the
median of --rounds rounds, each with new prompts.

Fairness: the flooding tenant alone first (--flood-seconds: its generated tokens/s with no other tenant
active, what the fairness rules must not slow); then a light tenant sends one short request at a time
(--light-requests), alone, then while the flooder keeps --flood-concurrency long requests in flight; then
again with the flooder capped by --max-requests-per-tenant (--cap). Prints the light tenant's p50 / p99
TTFT in each case and the ratio to running alone, measured in the same run (the issue's goal: p99 within
2x; with 100 requests the p99 is the second worst), and the flooder's tokens/s meanwhile. The scheduler's
fairness across tenants (runtime/scheduling/fair_share.py, scheduler.py's step bounds) is on by default;
--no-tenant-fairness gives the baseline it is measured against, --tenant-prefill-chunk another step bound.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import random
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, TypeVar

import httpx

from radixlang.runtime.engine import Engine
from radixlang.server.auth import AuthConfig
from radixlang.server.launch import background_server

T = TypeVar("T")
A, B, LIGHT, FLOOD = "tenant-a-key", "tenant-b-key", "light-key", "flood-key"
KEYS = {A: "a", B: "b", LIGHT: "light", FLOOD: "flood"}


def random_ids(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(1000, 40000) for _ in range(n)]


async def ttft(http: httpx.AsyncClient, key: str, body: dict[str, Any]) -> tuple[float, int]:
    """(seconds to the first streamed token, cached prompt tokens) of one /generate request."""
    started = time.perf_counter()
    first, cached = None, 0
    async with http.stream("POST", "/generate", json=body | {"stream": True},
                           headers={"Authorization": f"Bearer {key}"}) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data: {"):
                continue
            if first is None:
                first = time.perf_counter() - started
            cached = json.loads(line[6:])["meta_info"]["cached_tokens"]
    assert first is not None, "the stream sent no token"
    return first, cached


async def leak(url: str, rounds: int, prompt_tokens: int, seed: int) -> dict[str, float]:
    rng = random.Random(seed)
    rows: dict[str, list[float]] = {k: [] for k in ("a_cold", "a_repeat", "b_on_a", "b_cold")}
    cached: dict[str, list[int]] = {k: [] for k in rows}
    params = {"max_new_tokens": 1, "temperature": 0}
    async with httpx.AsyncClient(base_url=url, timeout=600) as http:
        await ttft(http, A, {"input_ids": random_ids(rng, 16), "sampling_params": params})  # warm-up
        for _ in range(rounds):
            ids, fresh = random_ids(rng, prompt_tokens), random_ids(rng, prompt_tokens)
            for name, key, prompt in (("a_cold", A, ids), ("a_repeat", A, ids), ("b_on_a", B, ids),
                                      ("b_cold", B, fresh)):
                t, c = await ttft(http, key, {"input_ids": prompt, "sampling_params": params})
                rows[name].append(t)
                cached[name].append(c)
    out = {name: statistics.median(ts) for name, ts in rows.items()}
    print(f"\nleak: a {prompt_tokens}-token prompt, median of {rounds} rounds (TTFT ms; cached tokens each round)")
    for name, label in (("a_cold", "A, first time"), ("a_repeat", "A, repeat"), ("b_on_a", "B, A's prompt"),
                        ("b_cold", "B, a fresh prompt")):
        print(f"  {label:<20} {out[name] * 1000:8.1f} ms   cached {cached[name]}")
    print(f"  B on A's prompt / B cold: {out['b_on_a'] / out['b_cold']:.2f}x   "
          f"A repeat / A cold: {out['a_repeat'] / out['a_cold']:.2f}x")
    assert all(c == 0 for c in cached["b_on_a"]), "B saw A's cached prefix"
    assert all(c == prompt_tokens - 1 for c in cached["a_repeat"]), "A's repeat was not fully cached"
    return out


LIGHT_NEW_TOKENS = 4
FLOOD_NEW_TOKENS = 64


async def light_ttfts(http: httpx.AsyncClient, n: int, rng: random.Random) -> list[float]:
    out = []
    for _ in range(n):
        t, _ = await ttft(http, LIGHT, {"input_ids": random_ids(rng, 64), "sampling_params": {
            "max_new_tokens": LIGHT_NEW_TOKENS, "temperature": 0, "ignore_eos": True}})
        out.append(t)
    return out


async def flood(http: httpx.AsyncClient, stop: asyncio.Event, rng: random.Random) -> int:
    """One of the flooder's request loops: long prompts, long answers, until `stop`; how many were refused."""
    refused = 0
    while not stop.is_set():
        body = {"input_ids": random_ids(rng, 256),
                "sampling_params": {"max_new_tokens": FLOOD_NEW_TOKENS, "ignore_eos": True}}
        r = await http.post("/generate", json=body, headers={"Authorization": f"Bearer {FLOOD}"})
        if r.status_code == 429:
            refused += 1
            await asyncio.sleep(float(r.headers.get("retry-after", "1")))
        else:
            r.raise_for_status()
    return refused


class Flood:
    """The flooder's request loops while a block runs, and the tokens generated meanwhile (the engine's
    count from /metrics: the flooder's and the light tenant's `light` tokens, which `end` takes off)."""

    def __init__(self, http: httpx.AsyncClient, concurrency: int, seed: int) -> None:
        self.http, self.concurrency, self.seed = http, concurrency, seed

    async def __aenter__(self) -> "Flood":
        self.stop = asyncio.Event()
        self.tasks = [asyncio.create_task(flood(self.http, self.stop, random.Random(self.seed + i)))
                      for i in range(self.concurrency)]
        self.generated, self.started = await self._generated(), time.perf_counter()
        return self

    async def _generated(self) -> float:
        r = await self.http.get("/metrics", headers={"Authorization": f"Bearer {FLOOD}"})
        r.raise_for_status()
        [line] = [x for x in r.text.splitlines() if x.startswith("radixlang_generation_tokens_total{")]
        return float(line.rsplit(" ", 1)[1])

    async def end(self, light: int = 0) -> tuple[int, float]:
        """Stops the loops (their requests in flight finish); (requests refused, the flooder's tokens/s)."""
        seconds = time.perf_counter() - self.started
        tokens = await self._generated() - self.generated - light
        self.stop.set()
        return sum(await asyncio.gather(*self.tasks)), tokens / seconds

    async def __aexit__(self, *exc: object) -> None:
        self.stop.set()
        await asyncio.gather(*self.tasks)


def percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))]


async def flood_alone(url: str, concurrency: int, seconds: float, seed: int) -> float:
    """The flooder's generated tokens/s with no other tenant active."""
    limits = httpx.Limits(max_connections=concurrency + 1)
    async with httpx.AsyncClient(base_url=url, timeout=None, limits=limits) as http:
        async with Flood(http, concurrency, seed) as f:
            await asyncio.sleep(seconds)
            return (await f.end())[1]


@dataclass
class Fairness:
    alone: list[float] = field(default_factory=list)  # the light tenant's TTFTs, seconds
    loaded: list[float] = field(default_factory=list)
    refused: int = 0  # the flooder's requests answered 429
    flood_rates: list[float] = field(default_factory=list)  # the flooder's tokens/s in each loaded block


async def fairness(url: str, requests: int, blocks: int, concurrency: int, seed: int) -> Fairness:
    """The light tenant's TTFTs alone and beside the flood, in alternating blocks: the machine's load
    changes over a run (a shared CPU's by several times), and both sides of the ratio see the same."""
    rng = random.Random(seed)
    out = Fairness()
    limits = httpx.Limits(max_connections=concurrency + 4)
    async with httpx.AsyncClient(base_url=url, timeout=None, limits=limits) as http:
        for b in range(blocks):
            n = requests // blocks + (b < requests % blocks)
            out.alone += await light_ttfts(http, n, rng)
            async with Flood(http, concurrency, seed + 100 * b) as f:
                await asyncio.sleep(1.0)  # the flood is under way
                out.loaded += await light_ttfts(http, n, rng)
                refused, rate = await f.end(light=n * LIGHT_NEW_TOKENS)
            out.refused += refused
            out.flood_rates.append(rate)
    return out


def report(label: str, f: Fairness) -> None:
    p99a, p99l = percentile(f.alone, 0.99), percentile(f.loaded, 0.99)
    p50a, p50l = statistics.median(f.alone), statistics.median(f.loaded)
    print(f"  {label:<26} p50 {p50l * 1000:7.1f} ms  p99 {p99l * 1000:7.1f} ms  (alone: p50 {p50a * 1000:.1f}, "
          f"p99 {p99a * 1000:.1f})  p50 ratio {p50l / p50a:.2f}x  p99 ratio {p99l / p99a:.2f}x  "
          f"flood {statistics.mean(f.flood_rates):.1f} tokens/s, requests refused (429): {f.refused}")


def _run(coroutine: Callable[..., Awaitable[T]], *args: Any) -> T:  # noqa: ANN401 - the coroutine's own
    return asyncio.run(coroutine(*args))


def in_client_process(coroutine: Callable[..., Awaitable[T]], *args: Any) -> T:  # noqa: ANN401 - as above
    """Runs the clients in a process of their own, as a server's clients are: in the server's process their
    Python work would take the GIL from the engine's thread and slow its steps, the flood's more than the
    light tenant's alone."""
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(_run, coroutine, *args).result()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="GGUF file or HF folder (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--prompt-tokens", type=int, default=600)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--light-requests", type=int, default=100, help="per case (the p99 needs ~100)")
    parser.add_argument("--flood-seconds", type=float, default=60.0,
                        help="the flooder alone (0: skip); a few of its prefill + decode cycles")
    parser.add_argument("--blocks", type=int, default=5,
                        help="alone and loaded requests alternate in this many blocks")
    parser.add_argument("--flood-concurrency", type=int, default=8)
    parser.add_argument("--cap", type=int, default=2, help="the flooder's --max-requests-per-tenant in the last run")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default=None)
    parser.add_argument("--max-prefill-tokens", type=int, default=None,
                        help="the engine's prefill budget per step (a step's length bounds a request's wait)")
    parser.add_argument("--skip-fairness", action="store_true")
    parser.add_argument("--skip-leak", action="store_true")
    parser.add_argument("--skip-cap", action="store_true", help="skip the run with the flooder capped")
    parser.add_argument("--tenant-prefill-chunk", type=int, default=None,
                        help="the engine's tenant_prefill_chunk (default: the engine's default)")
    parser.add_argument("--no-tenant-fairness", action="store_true",
                        help="the scheduler's fairness across tenants off (the baseline it is measured against)")
    args = parser.parse_args(argv)
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]  # figures show as they come
    options: dict[str, Any] = {"device": args.device} if args.device else {}
    if args.max_prefill_tokens:
        options["max_prefill_tokens"] = args.max_prefill_tokens
    if args.no_tenant_fairness:
        options["disable_tenant_fairness"] = True
    if args.tenant_prefill_chunk is not None:
        options["tenant_prefill_chunk"] = args.tenant_prefill_chunk
    with Engine(model=args.model, **options) as engine:
        with background_server(engine, auth=AuthConfig(dict(KEYS))) as server:
            if not args.skip_leak:
                in_client_process(leak, server.url, args.rounds, args.prompt_tokens, args.seed)
            if args.skip_fairness:
                return
            if args.flood_seconds:
                time.sleep(engine.config.tenant_active_seconds)  # the leak's tenants are no longer active
                rate = in_client_process(flood_alone, server.url, args.flood_concurrency, args.flood_seconds,
                                         args.seed)
                print(f"\nthe flooder alone ({args.flood_concurrency} in flight, {args.flood_seconds:.0f} s): "
                      f"{rate:.1f} generated tokens/s")
            print(f"\nfairness: the light tenant's TTFT over {args.light_requests} short requests, one at a time, "
                  f"alone and while a flooder keeps {args.flood_concurrency} long ones in flight, in "
                  f"{args.blocks} alternating blocks")
            report("flood, no cap", in_client_process(fairness, server.url, args.light_requests, args.blocks,
                                                      args.flood_concurrency, args.seed + 1))
        engine.check_invariants()
        if args.skip_cap:
            return
        capped = AuthConfig(dict(KEYS), max_requests_per_tenant=args.cap)
        with background_server(engine, auth=capped) as server:
            report(f"flood capped at {args.cap} in flight", in_client_process(
                fairness, server.url, args.light_requests, args.blocks, args.flood_concurrency, args.seed + 2))
        engine.check_invariants()


if __name__ == "__main__":
    main()
