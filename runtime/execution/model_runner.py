"""Runs one step's batch: plans attention once, runs the model, and computes the logits rows needed."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ...kernels.backend import AttentionBackend, AttentionBatch
from ..batch import StepBatch, prefix_groups
from ..config import CASCADE_MIN_PREFIX
from ..kv.memory import ReqToToken
from ..lora.pool import LoraPool
from ..models.eplb import Placement, apply_placements, expert_load
from ..models.llama import ForwardContext, LlamaForCausalLM, LoraDelta
from ..models.moe_llama import moe_blocks
from ..multimodal.encoder import ImageEncoder
from ..multimodal.prompt import ImagePart, step_images
from .cuda_graph import DecodeGraphs


@dataclass(slots=True)
class StepInputs:
    """All the model needs for one step, free of request objects (tensor-parallel ranks receive it)."""

    input_ids: list[int]
    attention: AttentionBatch
    hidden_rows: list[int]  # for each logits row, its token's index in the step
    embeds: tuple[torch.Tensor, torch.Tensor] | None = None  # (token rows, image embeddings) replacing them
    images: tuple[ImagePart, ...] = ()  # where `embeds` came from: what a worker rank resolves them from
    lora: LoraDelta | None = None  # the step's adapter rows (runtime/lora; one rank only: never sent to workers)


class ModelRunner:
    """`req_to_token`: None on a tensor-parallel worker rank, whose steps arrive as StepInputs."""

    def __init__(self, model: LlamaForCausalLM, req_to_token: ReqToToken | None, attn: AttentionBackend,
                 device: torch.device, graphs: DecodeGraphs | None = None,
                 images: ImageEncoder | None = None, image_token_id: int = 0, lora: LoraPool | None = None):
        self.model = model
        self.lora = lora  # None: the model serves no adapters
        self.req_to_token = req_to_token
        self.attn = attn
        self.device = device
        self.graphs = graphs  # None: every step runs eagerly
        self.cascade_min = CASCADE_MIN_PREFIX if attn.supports_cascade else None  # None: no cascade
        self.images, self.image_token_id = images, image_token_id  # a vision-language model's image side

    def forward(self, batch: StepBatch) -> torch.Tensor | None:
        """[len(batch.hidden_rows), vocab] float32 logits, or None when no row is wanted."""
        groups = [] if self.cascade_min is None else prefix_groups(batch.items, self.cascade_min)
        lora = None if self.lora is None else self.lora.step([item.req.lora for item in batch.items],
                                                             [item.length for item in batch.items])
        # decodes sharing a long prefix read it once, in the graphs' cascade variant; decode steps never
        # carry image positions (images sit in prompts), so graphs serve VLMs too; adapter rows run eagerly
        if lora is None and self.graphs is not None and self.graphs.fits(batch):
            return self.graphs.forward(batch, groups)
        return self.run(self.step_inputs(batch, groups, lora))

    def step_inputs(self, batch: StepBatch, groups: list[tuple[list[int], int]],
                    lora: LoraDelta | None = None) -> StepInputs:
        assert self.req_to_token is not None, "worker ranks receive their StepInputs, never build them"
        attention = batch.attention_batch(self.req_to_token.table, groups)
        if self.images is None:
            return StepInputs(batch.input_ids(), attention, batch.hidden_rows, lora=lora)
        images = step_images(batch, self.image_token_id)
        return StepInputs(images.input_ids, attention, batch.hidden_rows, self.images.embed_step(images), images.parts,
                          lora)

    def run(self, inputs: StepInputs) -> torch.Tensor | None:
        plan = self.attn.plan(inputs.attention)
        input_ids = torch.tensor(inputs.input_ids, dtype=torch.int64, device=self.device)
        hidden = self.model(input_ids, plan.positions, ForwardContext(self.attn, inputs.lora), inputs.embeds)
        rows = inputs.hidden_rows
        if not rows:
            return None
        if len(rows) < hidden.shape[0]:
            hidden = hidden[torch.tensor(rows, dtype=torch.int64, device=self.device)]
        logits = self.model.compute_logits(hidden)
        return logits if inputs.lora is None else inputs.lora.logits(rows, hidden, logits)

    @property
    def ep_size(self) -> int:
        """The ranks a MoE model's experts are partitioned over (1: each rank holds every expert)."""
        blocks = moe_blocks(self.model)
        return blocks[0].dispatch.tp.size if blocks and blocks[0].dispatch is not None else 1

    def expert_load(self) -> torch.Tensor:
        """[MoE layers, experts]: tokens the routers sent to each expert since the last placement."""
        return expert_load(moe_blocks(self.model))

    def place_experts(self, placements: list[Placement]) -> None:
        """Applies an EPLB placement per MoE layer."""
        apply_placements(moe_blocks(self.model), placements)

    def close(self) -> None:
        """Releases what the runner started (tensor-parallel worker ranks); nothing here."""
