"""Rank 0's model runner under tensor parallelism: each step goes to the worker ranks first, then rank
0 runs its own shard of the model together with them."""
from __future__ import annotations

import torch

from ...kernels.backend import AttentionBackend
from ..execution.model_runner import ModelRunner, StepInputs
from ..kv.memory import ReqToToken
from ..models.llama import LlamaForCausalLM
from ..multimodal.encoder import ImageEncoder
from .workers import TPWorkers


class TPRunner(ModelRunner):
    def __init__(self, model: LlamaForCausalLM, req_to_token: ReqToToken, attn: AttentionBackend,
                 device: torch.device, workers: TPWorkers, images: ImageEncoder | None = None,
                 image_token_id: int = 0):
        super().__init__(model, req_to_token, attn, device, None, images, image_token_id)
        self.workers = workers

    def run(self, inputs: StepInputs) -> torch.Tensor | None:
        # step_inputs already published the step's new image embeddings: each worker's mirror has them
        self.workers.send_step(inputs)
        try:
            return super().run(inputs)
        except Exception as e:  # noqa: BLE001 - once rank 0 leaves a step midway the ranks are out of step
            raise self.workers.fail(e) from e

    def place_experts(self, placements) -> None:
        # every rank applies the same placements, in step: the weights move through a collective
        self.workers.place_experts(placements)
        try:
            super().place_experts(placements)
        except Exception as e:  # noqa: BLE001 - the ranks are out of step
            raise self.workers.fail(e) from e

    def close(self) -> None:
        self.workers.close()
