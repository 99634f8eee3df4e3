"""Runs one step's batch: plans attention once, runs the model, and computes the logits rows needed."""
from __future__ import annotations

import torch

from ..kernels.backend import AttentionBackend
from .batch import StepBatch
from .config import CASCADE_MIN_PREFIX
from .memory import ReqToToken
from .models.llama import ForwardContext, LlamaForCausalLM
from .multimodal.encoder import ImageEncoder
from .multimodal.prompt import step_inputs


class ModelRunner:
    def __init__(self, model: LlamaForCausalLM, req_to_token: ReqToToken, attn: AttentionBackend,
                 device: torch.device, images: ImageEncoder | None = None, image_token_id: int = 0):
        self.model = model
        self.req_to_token = req_to_token
        self.attn = attn
        self.device = device
        self.images, self.image_token_id = images, image_token_id  # a vision-language model's image side

    def forward(self, batch: StepBatch) -> torch.Tensor | None:
        """[len(batch.hidden_rows), vocab] float32 logits, or None when no row is wanted."""
        cascade_min = CASCADE_MIN_PREFIX if self.attn.supports_cascade else None
        plan = self.attn.plan(batch.attention_batch(self.req_to_token.table, cascade_min))
        embeds = None
        if self.images is None:
            ids = batch.input_ids()
        else:
            inputs = step_inputs(batch, self.images, self.image_token_id, self.device)
            ids = inputs.input_ids
            embeds = None if inputs.embeds is None else (inputs.embed_rows, inputs.embeds)
        input_ids = torch.tensor(ids, dtype=torch.int64, device=self.device)
        hidden = self.model(input_ids, plan.positions, ForwardContext(self.attn), embeds)
        if not batch.hidden_rows:
            return None
        if len(batch.hidden_rows) < hidden.shape[0]:
            hidden = hidden[torch.tensor(batch.hidden_rows, dtype=torch.int64, device=self.device)]
        return self.model.compute_logits(hidden)
