"""The draft-model drafter (SELF: the target's first layers; STANDALONE: a second model file) on tiny
random models. Oracles: a dense, cache-free forward pass of the draft model expanding the same top-k tree;
the same engine without speculation (greedy and seeded outputs must be identical); the KV invariant of both
pools after every step."""
from __future__ import annotations

import json

import pytest
import torch

from radixlang.runtime.config import SPEC_VERIFY_OVERHEAD, EngineConfig
from radixlang.runtime.draft_tree import best_nodes, subtree
from radixlang.runtime.speculative.pacing import Pacing

from ...conftest import TINY_CONFIG, tiny_weights, write_hf_folder
from ..models.test_llama import dense_logits
from .scripted import draft_every_step
from .test_speculative_engine import GREEDY, PROMPTS, SAMPLED, Harness, assert_same, bare_req, plain_outputs  # noqa: F401

SELF = {"speculative_algorithm": "SELF", "speculative_draft_layers": 1}
DRAFT_CONFIG = {**TINY_CONFIG, "num_hidden_layers": 1, "hidden_size": 32, "intermediate_size": 64}


@pytest.fixture(scope="module")
def draft_dir(tmp_path_factory, tokenizer):
    """A 1-layer random model with other weights and SmolLM2's tokenizer: a STANDALONE draft."""
    return write_hf_folder(tmp_path_factory.mktemp("tiny-draft"), DRAFT_CONFIG, tiny_weights(DRAFT_CONFIG, seed=5),
                           tokenizer)


def standalone(draft_dir) -> dict:
    return {"speculative_algorithm": "STANDALONE", "speculative_draft_model": str(draft_dir)}


def dense_tree(weights: dict, cfg: dict, ids: list[int], budget: int, topk: int, steps: int):
    """The top-k tree by cumulative log q, each level's distribution from a dense pass over the path."""
    tokens, parents, scores = [], [], []

    def children(parent: int, path: list[int]) -> list[int]:
        logq = torch.log_softmax(dense_logits(weights, cfg, ids + path)[-1].double(), -1)
        top = logq.topk(topk)
        base = scores[parent] if parent >= 0 else 0.0
        new = []
        for lq, token in zip(top.values.tolist(), top.indices.tolist()):
            new.append(len(tokens))
            tokens.append(token)
            parents.append(parent)
            scores.append(base + lq)
        return new

    def path(i: int) -> list[int]:
        return [] if i < 0 else path(parents[i]) + [tokens[i]]

    frontier = sorted(children(-1, []), key=lambda i: -scores[i])[:topk]
    for _ in range(1, min(steps, budget)):
        new = [c for f in frontier for c in children(f, path(f))]
        frontier = sorted(new, key=lambda i: -scores[i])[:topk]
    return subtree(tokens, parents, best_nodes(scores, budget))


@pytest.mark.parametrize("kind", ["self", "standalone"])
def test_draft_trees_equal_a_dense_expansion_of_the_draft_model(tiny_model_dir, draft_dir, tokenizer, kind):
    options = SELF if kind == "self" else standalone(draft_dir)
    h = Harness(tiny_model_dir, speculative_num_draft_tokens=6, speculative_eagle_topk=3, **options)
    drafter = h.sched.drafter
    if kind == "self":
        weights, cfg = tiny_weights(TINY_CONFIG), {**TINY_CONFIG, "num_hidden_layers": 1}
    else:
        weights, cfg = tiny_weights(DRAFT_CONFIG, seed=5), DRAFT_CONFIG
    reqs = [bare_req(tokenizer, f"r{i}", p) for i, p in enumerate(PROMPTS[:3])]
    for round_ in range(3):  # later rounds catch up on the tokens "verified" since the last
        for req in reqs:
            drafter.verified(req, 6, 6)  # a good record: full-size trees
        trees = drafter.propose([(req, 10) for req in reqs])
        for req, tree in zip(reqs, trees):
            budget = min(6, 1 + int(2 * drafter.pacing.accepted))
            expected = dense_tree(weights, cfg, req.tokens(0, req.fill_len), budget, 3, 4)
            assert tree == expected
            req.output_ids += tree.tokens[:1] + [7 + round_]  # one node accepted, then a bonus token
        drafter.check(reqs)
    for req in reqs:
        drafter.forget(req, finished=True)
    drafter.check([])
    assert drafter.kv.num_free_slots + drafter.kv.cached_tokens == drafter.kv.num_slots


@pytest.mark.parametrize("params", [GREEDY, *SAMPLED], ids=["greedy", "sampled", "sampled-penalties"])
@pytest.mark.parametrize("kind", ["self", "standalone"])
def test_outputs_equal_plain_decoding(tiny_engine_factory, draft_dir, params, kind):
    options = SELF if kind == "self" else standalone(draft_dir)
    plain = tiny_engine_factory().generate(PROMPTS, params)
    engine = tiny_engine_factory(**options)
    draft_every_step(engine.scheduler.drafter)
    spec = engine.generate(PROMPTS, params)
    assert_same(plain, spec)
    stats = engine.stats()
    assert stats["spec_verify_steps_total"] > 0
    assert stats["spec_draft_tokens_total"] > stats["spec_accepted_tokens_total"], "drafts were rejected"
    if kind == "self":  # the first layer of the tiny model often agrees with both
        assert stats["spec_accepted_tokens_total"] > 0


def test_draft_kv_of_a_prompt_is_cached_and_reused(tiny_model_dir):
    h = Harness(tiny_model_dir, **SELF)
    draft_every_step(h.sched.drafter)
    h.add("a", PROMPTS[0])
    h.run()
    drafter = h.sched.drafter
    assert drafter.kv.cached_tokens >= len(h.tokenizer.encode(PROMPTS[0]))
    computed = []
    real_forward = drafter._forward

    def counting_forward(items):
        computed.extend(seq.slot_len - start for seq, start, _, _ in items)
        return real_forward(items)

    drafter._forward = counting_forward
    h.add("b", PROMPTS[0])
    h.step()  # prefill; the draft round after it admits b's draft sequence
    # a's prompt and greedy output (b's too) are in the draft cache: only b's last token is computed
    assert computed[0] == 1
    h.run()


def test_many_rejections_aborts_and_failed_draft_forwards_leak_no_draft_kv(tiny_model_dir, draft_dir):
    h = Harness(tiny_model_dir, **standalone(draft_dir))  # another model's drafts: nearly all rejected
    draft_every_step(h.sched.drafter)
    reqs = [h.add(f"r{i}", p) for i, p in enumerate(PROMPTS)]
    while not all(r.num_draft for r in reqs[:2]):
        h.step()
    h.sched.abort("r0")  # a draft proposed, its verify not run yet
    h.sched.check_invariants()
    drafter = h.sched.drafter
    real_forward = drafter._forward
    failed = []

    def failing_forward(items):
        if not failed and any(parents is not None for _, _, parents, _ in items):
            failed.append([seq.rid for seq, *_ in items])  # a tree level: scratch slots are held
            raise RuntimeError("device lost")
        return real_forward(items)

    drafter._forward = failing_forward
    for _ in range(50):
        h.step()
        if failed:
            break
    drafter._forward = real_forward
    assert failed and all(h.chunks[rid][-1].finish_reason == "abort" for rid in failed[0])
    h.run()
    assert drafter.kv.num_free_slots + drafter.kv.cached_tokens == drafter.kv.num_slots


def test_preemption_and_a_small_pool_keep_outputs(tiny_model_dir, plain_outputs):
    h = Harness(tiny_model_dir, kv_cache_tokens=160, **SELF)
    draft_every_step(h.sched.drafter)
    for i, p in enumerate(PROMPTS):
        h.add(f"r{i}", p)
    h.run()
    assert h.sched.counters.preemptions > 0
    assert {rid: h.output(rid) for rid in plain_outputs} == plain_outputs


def test_bad_draft_model_options_are_refused_clearly(tiny_model_dir, draft_dir, tmp_path, tokenizer):
    for options, field in [({"speculative_algorithm": "STANDALONE"}, "speculative_draft_model"),
                           ({"speculative_algorithm": "NGRAM", "speculative_draft_model": str(draft_dir)},
                            "speculative_draft_model"),
                           ({**SELF, "speculative_num_steps": 0}, "speculative_num_steps"),
                           ({**SELF, "speculative_eagle_topk": 0}, "speculative_eagle_topk"),
                           ({**SELF, "speculative_draft_layers": 0}, "speculative_draft_layers")]:
        with pytest.raises(ValueError, match=field):
            EngineConfig.from_options(str(tiny_model_dir), device="cpu", **options)
    from radixlang.runtime.engine import Engine

    with pytest.raises(ValueError, match=r"speculative_draft_layers must be in \[1, 1\]"):
        Engine(str(tiny_model_dir), device="cpu", kv_cache_tokens=256, **{**SELF, "speculative_draft_layers": 2})
    other_vocab = {**DRAFT_CONFIG, "vocab_size": 1000}
    small = write_hf_folder(tmp_path / "small-vocab", other_vocab, tiny_weights(other_vocab), tokenizer)
    with pytest.raises(ValueError, match="vocabulary of 1000 tokens.*share the target's tokenizer"):
        Engine(str(tiny_model_dir), device="cpu", kv_cache_tokens=256, **standalone(small))
    swapped = write_hf_folder(tmp_path / "swapped", DRAFT_CONFIG, tiny_weights(DRAFT_CONFIG), tokenizer)
    tok_json = json.loads((swapped / "tokenizer.json").read_text())
    vocab = tok_json["model"]["vocab"]
    a, b = list(vocab)[300:302]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (swapped / "tokenizer.json").write_text(json.dumps(tok_json))
    with pytest.raises(ValueError, match="different tokenizer"):
        Engine(str(tiny_model_dir), device="cpu", kv_cache_tokens=256, **standalone(swapped))


def test_a_catch_up_forward_computes_at_most_a_prefill_chunk_unless_alone(tiny_model_dir, plain_outputs):
    h = Harness(tiny_model_dir, max_prefill_tokens=24, **SELF)
    draft_every_step(h.sched.drafter)
    drafter = h.sched.drafter
    real_forward = drafter._forward
    catch_ups = []

    def recording_forward(items):
        if all(parents is None for _, _, parents, _ in items):
            catch_ups.append([seq.slot_len - start for seq, start, _, _ in items])
        return real_forward(items)

    drafter._forward = recording_forward
    for i, p in enumerate(PROMPTS):
        h.add(f"r{i}", p)
    h.run()
    assert any(len(sizes) > 1 for sizes in catch_ups), "catch-ups were batched"
    assert all(len(sizes) == 1 or sum(sizes) <= 24 for sizes in catch_ups)
    assert {rid: h.output(rid) for rid in plain_outputs} == plain_outputs


def layer_weights(cfg: dict) -> int:
    """Matmul weights of one decoder layer, from the config alone (plus its two norms)."""
    hidden, inter = cfg["hidden_size"], cfg["intermediate_size"]
    head_dim = hidden // cfg["num_attention_heads"]
    q, kv = cfg["num_attention_heads"] * head_dim, cfg["num_key_value_heads"] * head_dim
    return hidden * (q + 2 * kv) + q * hidden + 3 * hidden * inter + 2 * hidden


@pytest.mark.parametrize("kind", ["self", "standalone"])
def test_drafts_must_accept_enough_to_pay_for_the_verify_and_the_draft_forwards(tiny_model_dir, draft_dir, kind):
    options = SELF if kind == "self" else standalone(draft_dir)
    h = Harness(tiny_model_dir, speculative_num_steps=3, **options)
    head = TINY_CONFIG["vocab_size"] * TINY_CONFIG["hidden_size"]
    target = head + 2 * layer_weights(TINY_CONFIG)
    draft = head + layer_weights(TINY_CONFIG) if kind == "self" else \
        DRAFT_CONFIG["vocab_size"] * DRAFT_CONFIG["hidden_size"] + layer_weights(DRAFT_CONFIG)
    assert h.sched.drafter.pacing.break_even == pytest.approx(SPEC_VERIFY_OVERHEAD + 3 * draft / target)


def test_a_draft_model_that_does_not_pay_only_probes(tiny_model_dir, plain_outputs):
    h = Harness(tiny_model_dir, **SELF)
    drafter = h.sched.drafter
    drafter.pacing = Pacing.for_cost(1000.0)  # no verify can pay: the drafter backs off at once
    rounds = []
    real_expand = drafter._expand

    def counting_expand(batch):
        rounds.extend(r.seq.rid for r in batch)
        return real_expand(batch)

    drafter._expand = counting_expand
    for rid, prompt in zip(plain_outputs, PROMPTS):
        h.add(rid, prompt, **GREEDY)
    h.run()
    assert {rid: h.output(rid) for rid in plain_outputs} == plain_outputs
    # 4 requests x 47 chances to draft (48 tokens); the first step's 4 chances all draft (no verify has
    # failed yet), then 4 misses sit out 15 chances, and one probe every 31, 63 ... after that
    assert sorted(rounds[:4]) == sorted(plain_outputs)  # in the scheduler's order (shortest prefill first)
    assert 5 <= len(rounds) <= 4 + 4


def test_flush_cache_empties_the_draft_cache(tiny_engine_factory):
    engine = tiny_engine_factory(**SELF)
    engine.generate(PROMPTS[:2], GREEDY)
    drafter = engine.scheduler.drafter
    assert drafter.kv.cached_tokens > 0
    assert engine.flush_cache()
    assert drafter.kv.cached_tokens == 0
    engine.check_invariants()
