"""The baselines a user without a DSL would pick: a plain language model called from hand-written Python.

Both speak one small interface, which every workload's baseline control flow is written against:
  generate(prompts, max_new_tokens, stop) -> texts   (greedy; batched where the library batches)
  score([(prompt, choices)]) -> mean log-prob per choice token (radixlang's token_length_normalized)
  chat_prompt(messages) -> the model's chat template, rendered
They count generated tokens and record each call's latency (once per sequence it served), so the runner
can read both after a workload. Prompts are tokenised by radixlang's tokenizer for the same GGUF (the
`tokenizers` library), so every system sees the same token ids.
"""
from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from radixlang.runtime.tokenizer import Tokenizer

from ..hf_baseline import load_causal_lm

# llama.cpp built without AMX: its tile instructions fault on these VMs
LLAMA_CPP_CMAKE_ARGS = ("-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=ON "
                        "-DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON -DGGML_AMX_TILE=OFF "
                        "-DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF")


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def cut_at_stop(text: str, stop: Sequence[str]) -> str:
    ends = [text.find(s) for s in stop if s in text]
    return text[:min(ends)] if ends else text


def choice_span(tokenizer: Tokenizer, prompt: str, choice: str) -> tuple[list[int], int]:
    """Prompt and choice tokenised together (token healing, as radixlang's select does) and the first
    position where they differ from the prompt alone: the tokens that are scored."""
    full = tokenizer.encode(prompt + choice)
    return full, max(1, min(common_prefix(tokenizer.encode(prompt), full), len(full) - 1))


class PlainLM:
    """Counters and the chat template, shared by both baselines."""

    label = ""

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        self.generated_tokens = 0
        self.latencies: list[float] = []

    def chat_prompt(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        return self.tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt)

    def _record(self, started: float, sequences: int) -> None:
        self.latencies += [time.perf_counter() - started] * sequences


class StopOnStrings:
    """transformers stopping criterion: a row is done once its new text holds a stop string."""

    def __init__(self, tokenizer: Tokenizer, prompt_width: int, stop: Sequence[str]):
        self.tokenizer, self.width, self.stop = tokenizer, prompt_width, list(stop)

    def __call__(self, input_ids: torch.Tensor, scores: Any, **kwargs: Any) -> torch.Tensor:
        texts = [self.tokenizer.decode(row[self.width:]) for row in input_ids.tolist()]
        return torch.tensor([any(s in t for s in self.stop) for t in texts], device=input_ids.device)


class TransformersLM(PlainLM):
    """HF transformers `generate`, greedy, left-padded batches of up to `batch_size` prompts."""

    label = "HF transformers"

    def __init__(self, model_path: str | Path, tokenizer: Tokenizer, batch_size: int, device: str = "cpu"):
        super().__init__(tokenizer)
        self.model = load_causal_lm(model_path, device)
        self.batch_size, self.device = batch_size, device
        self.eos = list(tokenizer.eos_token_ids)

    def _padded(self, rows: list[list[int]], left: bool) -> tuple[torch.Tensor, torch.Tensor]:
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), self.eos[0], dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            span = slice(width - len(r), width) if left else slice(0, len(r))
            ids[i, span], mask[i, span] = torch.tensor(r), 1
        return ids.to(self.device), mask.to(self.device)

    def generate(self, prompts: list[str], max_new_tokens: int, stop: Sequence[str] = ()) -> list[str]:
        texts: list[str] = []
        for i in range(0, len(prompts), self.batch_size):
            texts += self._generate_batch(prompts[i:i + self.batch_size], max_new_tokens, stop)
        return texts

    def _generate_batch(self, prompts: list[str], max_new_tokens: int, stop: Sequence[str]) -> list[str]:
        from transformers import StoppingCriteriaList

        started = time.perf_counter()
        ids, mask = self._padded([self.tokenizer.encode(p) for p in prompts], left=True)
        criteria = StoppingCriteriaList()
        if stop:
            criteria.append(StopOnStrings(self.tokenizer, ids.shape[1], stop))
        with torch.inference_mode():
            out = self.model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens,
                                      do_sample=False, temperature=None, top_p=None, top_k=None,
                                      pad_token_id=self.eos[0], eos_token_id=self.eos, stopping_criteria=criteria)
        texts = []
        for row in out[:, ids.shape[1]:].tolist():
            n = next((j for j, t in enumerate(row) if t in self.eos), len(row))
            self.generated_tokens += min(n + 1, len(row))  # the EOS is a generated token, as in radixlang
            texts.append(cut_at_stop(self.tokenizer.decode(row[:n]), stop))
        self._record(started, len(prompts))
        return texts

    def score(self, requests: list[tuple[str, list[str]]]) -> list[list[float]]:
        flat = [choice_span(self.tokenizer, prompt, c) for prompt, choices in requests for c in choices]
        means: list[float] = []
        for i in range(0, len(flat), self.batch_size):
            means += self._score_batch(flat[i:i + self.batch_size])
        out, k = [], 0
        for _, choices in requests:
            out.append(means[k:k + len(choices)])
            k += len(choices)
        return out

    def _score_batch(self, spans: list[tuple[list[int], int]]) -> list[float]:
        started = time.perf_counter()
        ids, mask = self._padded([full for full, _ in spans], left=False)
        with torch.inference_mode():
            logits = self.model(input_ids=ids, attention_mask=mask).logits
        means = []
        for row, (full, start) in enumerate(spans):
            logprobs = torch.log_softmax(logits[row, start - 1:len(full) - 1].float(), -1)
            targets = torch.tensor(full[start:], device=logprobs.device)
            means.append(logprobs.gather(1, targets[:, None]).mean().item())
        self._record(started, len(spans))
        return means


class LlamaCppLM(PlainLM):
    """llama.cpp through llama-cpp-python on the same GGUF; one sequence at a time (its Python API
    serves one), reusing the KV of the prompt prefix it shares with the previous call."""

    label = "llama.cpp"

    def __init__(self, model_path: str | Path, tokenizer: Tokenizer, context_length: int):
        import llama_cpp

        super().__init__(tokenizer)
        self.llm = llama_cpp.Llama(model_path=str(model_path), n_ctx=context_length, logits_all=True,
                                   n_threads=os.cpu_count(), verbose=False)

    def generate(self, prompts: list[str], max_new_tokens: int, stop: Sequence[str] = ()) -> list[str]:
        texts = []
        for prompt in prompts:
            started = time.perf_counter()
            out = self.llm.create_completion(self.tokenizer.encode(prompt), max_tokens=max_new_tokens,
                                             temperature=0.0, stop=list(stop) or None)
            self.generated_tokens += out["usage"]["completion_tokens"]
            texts.append(out["choices"][0]["text"])
            self._record(started, 1)
        return texts

    def score(self, requests: list[tuple[str, list[str]]]) -> list[list[float]]:
        out = []
        for prompt, choices in requests:
            row = []
            for choice in choices:
                started = time.perf_counter()
                full, start = choice_span(self.tokenizer, prompt, choice)
                self.llm.reset()
                self.llm.eval(full)
                logits = torch.from_numpy(self.llm.scores[start - 1:len(full) - 1].copy())
                logprobs = torch.log_softmax(logits.float(), -1)
                row.append(logprobs.gather(1, torch.tensor(full[start:])[:, None]).mean().item())
                self._record(started, 1)
            out.append(row)
        return out
