"""`radixlang quantize`: load a model in fp32, calibrate and quantize it, write an HF folder."""
from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from ..model_loading import load_model
from ..models.llama import use_fixed_order
from ..models.loading import weight_cache
from .calibration import MIN_TOKENS, calibration_documents, calibration_samples
from .gptq import GPTQSpec, dampened_hessian, gptq_quantize, rtn_quantize
from .hf_writer import Packed, write_folder
from .layerwise import LINEARS, FloatStream, linear_weight, record_inputs, run_layerwise

METHODS = ("gptq", "awq", "rtn", "smoothquant")
DAMPS = (0.01, 0.1, 1.0)  # the dampenings GPTQ picks from per linear (percdamp None): 0.01 is the paper's
ROTATION = "residual stream and v/o per head, randomized Hadamard (offline)"  # quantization_config's note
# GPTQ on the shipped prose (21k tokens of everyday registers): development perplexity 26.853 against 27.175
# on the shipped 2k; AWQ and SmoothQuant keep the 2k (AWQ on 16k of the prose 29.278 against 28.060)
DEFAULT_CALIBRATION = {"gptq": "prose"}
VALIDATION_EVERY = 4  # every 4th calibration sample is held out to pick it


@dataclass(frozen=True, slots=True)
class QuantizeOptions:
    method: str = "gptq"
    bits: int = 4  # weight-only methods (AWQ: 4 only, its format's); SmoothQuant is always W8A8
    group_size: int = 128
    act_order: bool = True  # GPTQ (desc_act): closed 66% of RTN's perplexity gap on SmolLM2, in order 38% (docs/changelog-2.md)
    static_groups: bool = False  # with act_order: groups of consecutive inputs, no permutation at load
    sym: bool = False
    # GPTQ dampening; None: picked per linear on held-out calibration samples (gptq_layers). 0.1 beat the
    # paper's 0.01 and the per-linear pick on held-out text (docs/models.md)
    percdamp: float | None = 0.1
    clip_search: bool = True  # GPTQ / AWQ: each group's range shrunk to the output-error-optimal one
    # SmoothQuant migration strength; None: searched per layer (on each layer's own simulated W8A8 output
    # error; it picks 0.7-0.8). With down_proj rotated its mean KL divergence from fp32 on the development
    # text was 0.0043 against 0.0061 for the paper's 0.5 everywhere (docs/models.md)
    alpha: float | None = None
    smooth: bool = True  # SmoothQuant without smoothing: plain (naive) W8A8
    # calibration.py's SOURCES or a file; None: the method's own (DEFAULT_CALIBRATION). On the development
    # text GPTQ rounded better on the shipped prose (21k tokens) than on the shipped 2k, AWQ worse (docs/models.md)
    calib: str | None = None
    seq_len: int = 256
    # calibration tokens at most: more tokens determine H better if they resemble the text the model will
    # read (corpus.py); the time to quantize grows with them (layer passes)
    calib_tokens: int = 32768  # all of `prose` (21k tokens)
    # torch threads while quantizing: GPTQ's per-column steps run on one thread whatever this says
    # (gptq.one_thread); the layer passes, most of the time on a large calibration set, use these
    threads: int = 1
    # SmoothQuant: the down_proj of this many layers (where its W8A8 error weighs most) stays in fp: on
    # SmolLM2 down_proj's per-token int8 inputs were the largest single share of W8A8's perplexity cost
    fp_down: int = 0
    # SmoothQuant: down_proj's input rotated by a Hadamard matrix at run time (models/linear/hadamard.py):
    # its W8A8 cost on the development text fell from +1.3% to +0.1% (smoothquant.py); radixlang's loader
    # applies it, other w8a8_int8 loaders (SGLang) would not
    rotate_down: bool = True
    # GPTQ / AWQ: the model rotated first (rotation.py: the residual stream and each head's v/o by randomized
    # Hadamard matrices, offline, the same function; the folder stays a plain GPTQ / AWQ one, its LM head
    # untied). Off: on SmolLM2 it made every int4 method worse on the development text (dev perplexity GPTQ
    # 27.18 -> 28.23, AWQ 28.44 -> 46.90, RTN 31.76 -> 56.12; docs/models.md): its huge residual channels,
    # damped by the norms' weights, meet every weight once those are folded and rotated. RTN stays plain
    rotate: bool = False
    # GPTQ: GPTAQ's asymmetric calibration, this fraction of the way from each linear's weights to those whose
    # outputs on the quantized model's inputs best match the fp model's on its own (asymmetric_target);
    # 0: plain GPTQ. 0.5: development KL from fp32 0.1033 -> 0.0890 (mean of two calibration orders;
    # docs/models.md), ~1.8x the calibration's CPU time (the fp passes). Other methods ignore it
    asymmetric: float = 0.5

    def validate(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"--method must be one of {METHODS}, got {self.method!r}")
        if self.bits not in (4, 8):
            raise ValueError(f"--bits must be 4 or 8, got {self.bits}")
        if self.method == "awq" and self.bits != 4:
            raise ValueError("--method awq writes AWQ's format, 4 bits only: --bits 4")
        if self.group_size not in (-1, 32, 64, 128):
            raise ValueError(f"--group-size must be one of -1, 32, 64, 128, got {self.group_size}")
        if self.percdamp is not None and not 0 < self.percdamp < 1:
            raise ValueError(f"--percdamp must be in (0, 1), got {self.percdamp}")
        if self.alpha is not None and not 0 <= self.alpha <= 1:
            raise ValueError(f"--alpha must be in [0, 1], got {self.alpha}")
        if self.calib_tokens < MIN_TOKENS:
            raise ValueError(f"--calib-tokens must be >= {MIN_TOKENS}, got {self.calib_tokens}")
        if self.threads < 1:
            raise ValueError(f"--threads must be >= 1, got {self.threads}")
        if self.rotate and self.method not in ("gptq", "awq"):
            raise ValueError(f"--rotate is for --method gptq / awq (RTN is the plain baseline), got {self.method!r}")
        if not 0 <= self.asymmetric <= 1:
            raise ValueError(f"--asymmetric must be in [0, 1], got {self.asymmetric}")
        if self.fp_down < 0 or self.fp_down and not (self.method == "smoothquant" and self.smooth):
            raise ValueError(f"--fp-down must be >= 0, and is for --method smoothquant only, got {self.fp_down}")

    def calibration(self) -> str:
        return self.calib or DEFAULT_CALIBRATION.get(self.method, "builtin")

    def spec(self) -> GPTQSpec:
        return GPTQSpec(self.bits, self.group_size, self.sym, self.act_order and self.method == "gptq",
                        self.percdamp if self.percdamp is not None else DAMPS[1],
                        clip_search=self.clip_search, static_groups=self.static_groups)


def quantize(model_path: str | Path | None, out: str | Path, opts: QuantizeOptions) -> Path:
    """Writes the quantized folder to `out` and returns its path."""
    opts.validate()
    threads = torch.get_num_threads()
    torch.set_num_threads(opts.threads)
    try:
        return _quantize(model_path, Path(out), opts)
    finally:
        torch.set_num_threads(threads)


def _quantize(model_path: str | Path | None, out: Path, opts: QuantizeOptions) -> Path:
    from ..models.loading.loader import default_model_path
    from .awq import awq_layers
    from .rotation import rotate_model
    from .smoothquant import smooth_and_quantize

    model_path = Path(model_path) if model_path is not None else default_model_path()
    calibrated = opts.method in ("gptq", "awq") or opts.method == "smoothquant" and opts.smooth
    documents = calibration_documents(opts.calibration()) if calibrated else iter([])
    start = time.perf_counter()
    loaded = load_model(model_path, torch.device("cpu"), torch.float32)
    # the loader may be writing these very tensors to the weight cache on a background thread (a GGUF's
    # conversion, a folder's fused weights); calibration changes them in place, so let it finish first, or
    # the entry holds half-quantized weights that every later fp32 load of the model reads
    weight_cache.wait_for_write()
    use_fixed_order(loaded.model, on=False)  # no engine runs it: the calibration passes take MKL's faster GEMM
    samples = calibration_samples(loaded.tokenizer, documents, opts.seq_len, opts.calib_tokens)
    if opts.rotate:
        rotate_model(loaded.model)
    if opts.method == "rtn":
        packed: dict[str, Packed] = rtn_layers(loaded.model, opts.spec())
    elif opts.method == "gptq":
        packed = gptq_layers(loaded.model, samples, opts.spec(), opts.percdamp, opts.asymmetric)
    elif opts.method == "awq":
        packed = dict(awq_layers(loaded.model, samples, opts.spec()))
    else:
        packed = smooth_and_quantize(loaded.model, samples, ("search" if opts.alpha is None else opts.alpha)
                                     if opts.smooth else None, keep_fp=opts.fp_down, rotate=opts.rotate_down)
    path = write_folder(out, model_path, loaded, packed, quantization_config(opts))
    tokens = sum(len(s) for s in samples)
    print(f"quantized {model_path.name} with {opts.method} on {tokens} calibration tokens in "
          f"{time.perf_counter() - start:.1f}s -> {path}")
    return path


def quantization_config(opts: QuantizeOptions) -> dict:
    # informative only (the rotation is in the weights): what was rotated, so a reader knows why the
    # norms' weights are 1 and the LM head is untied
    rotation = {"rotation": ROTATION} if opts.rotate else {}
    if opts.method == "smoothquant":
        alpha = ("per layer" if opts.alpha is None else opts.alpha) if opts.smooth else None
        return {"quant_method": "w8a8_int8", "smoothquant_alpha": alpha, "fp_down_proj_layers": opts.fp_down,
                "down_proj_rotation": "hadamard" if opts.rotate_down else None}
    if opts.method == "awq":
        return {"quant_method": "awq", "bits": 4, "group_size": opts.group_size, "version": "gemm",
                "zero_point": True, "quantizer": "radixlang awq"} | rotation
    act_order = opts.act_order and opts.method == "gptq"  # RTN rounds in input order
    return {"quant_method": "gptq", "bits": opts.bits, "group_size": opts.group_size, "desc_act": act_order,
            "sym": opts.sym, "damp_percent": opts.spec().percdamp,
            "damp_per_layer": opts.percdamp is None and opts.method == "gptq",
            "true_sequential": True, "static_groups": opts.static_groups and act_order,
            "checkpoint_format": "gptq", "lm_head": False, "quantizer": "radixlang " + opts.method} | rotation


def rtn_layers(model, spec: GPTQSpec) -> dict[str, Packed]:
    return {f"layers.{i}.{name}": rtn_quantize(layer.get_submodule(name).weight.detach(), spec)
            for i, layer in enumerate(model.layers) for name in LINEARS}


def gptq_layers(model, samples: list[torch.Tensor], spec: GPTQSpec, percdamp: float | None = None,
                asymmetric: float = 0.0) -> dict[str, Packed]:
    """GPTQ of every decoder linear, true-sequential: in forward order, each linear's Hessian comes from
    inputs computed with every linear before it (in this layer and the ones below) already quantized,
    so each compensates the error of those before it. One pass per linear, stopped at its input.

    Dampening per linear (`percdamp` None): GPTQ fits the directions of H the calibration text spans, and
    too little dampening overfits them (a linear with many inputs, down_proj, did worse than
    round-to-nearest on other text). So every VALIDATION_EVERY-th sample is held out: for each of DAMPS,
    GPTQ on the other samples' H, scored by the output error on the held-out ones', tr(dW H_val dW^T);
    the best dampening then quantizes the linear on every sample's H.

    SINK: in H = 2 sum_t c_t x_t x_t^T, a sample's first token has c_0 = sqrt(T) (T: the sample's tokens),
    the others c_t = 1. It is the attention sink: every later token reads its keys and values,
    so its error reaches all of them, yet in an unweighted H it is one rare direction among T, and GPTQ
    moves rounding error into such directions. Weighted T times, though, a few sinks are half of H, and
    GPTQ fits them at the other tokens' expense (SmolLM2-135M, in memory, H from the fp32 model, clip search,
    percdamp 0.01, perplexity of fidelity.py's fixed / long text: c_0 = 1 11.41 / 17.00, sqrt(T) 10.59 /
    16.09, T 12.03 / 17.86; RTN 12.10 / 17.72).

    ASYMMETRIC (GPTAQ, `asymmetric` > 0): plain GPTQ matches the quantized model's outputs on its own drifted
    inputs X_q; the fp model's outputs on its inputs X_fp are what should be matched. A FloatStream carries
    the samples through the fp layers alongside, and each linear is first moved `asymmetric` of the way to
    the least-squares fit of X_fp W^T from X_q (asymmetric_target), then rounded by GPTQ on X_q's H. On the
    development text (21k tokens of prose, mean of two calibration orders) 0.5 took the KL divergence from
    fp32 from 0.1033 to 0.0890 and the perplexity from 27.35 to 27.09, for ~1.8x the calibration's CPU time."""
    packed: dict[str, Packed] = {}
    validated = percdamp is None and len(samples) >= VALIDATION_EVERY
    fp = FloatStream(model, samples) if asymmetric else None

    def on_layer(index: int, layer, run) -> None:
        fp_inputs = fp.inputs(layer) if fp is not None else {}
        for name in LINEARS:
            weight = linear_weight(layer, name)
            k = weight.shape[1]
            hessians, rows = [torch.zeros(k, k), torch.zeros(k, k)], [0, 0]  # fitted on, held out
            cross = torch.zeros(k, k)  # X_fp^T X_q, weighted as H (asymmetric)
            seen = 0

            def observe(_: str, x: torch.Tensor) -> None:  # x: one sample's tokens, in order
                nonlocal seen
                part = int(validated and seen % VALIDATION_EVERY == VALIDATION_EVERY - 1)
                x = x.float()
                add_sink_weighted(hessians[part], x, x)
                if name in fp_inputs:
                    add_sink_weighted(cross, fp_inputs[name][seen], x)
                rows[part] += len(x)
                seen += 1

            handles = record_inputs(layer, observe, names=(name,))
            run(name)
            for h in handles:
                h.remove()
            w = weight.detach().float()
            damp = pick_damp(w, hessians[0] * (2 / rows[0]), hessians[1] * (2 / rows[1]), spec) if validated else (
                percdamp if percdamp is not None else DAMPS[1])
            hessian = (hessians[0] + hessians[1]).mul_(2 / sum(rows))
            if fp is not None:
                w = asymmetric_target(w, hessian, cross.mul_(2 / sum(rows)), damp, asymmetric)
            q = gptq_quantize(w, hessian, replace(spec, percdamp=damp))
            weight.copy_(q.dequantize())  # what the later linears calibrate on
            packed[f"layers.{index}.{name}"] = q

    if not samples:
        raise ValueError("GPTQ needs calibration text (--calibration)")
    run_layerwise(model, samples, on_layer, desc="GPTQ")
    return packed


def add_sink_weighted(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """acc += a^T b over one sample's tokens, its first token (the attention sink) counted sqrt(T) times."""
    acc.addmm_(a.T, b).addr_(a[0], b[0], alpha=len(b) ** 0.5 - 1)


def asymmetric_target(weight: torch.Tensor, hessian: torch.Tensor, cross: torch.Tensor, percdamp: float,
                      beta: float = 1.0) -> torch.Tensor:
    """GPTAQ's target (Li et al. 2025): the weights W* whose outputs on the quantized model's inputs X_q
    best match the fp model's outputs on its own inputs X_fp, min ||X_fp W^T - X_q W*^T||^2 + d ||W* - W||^2,
    W* = W + W (C - H) (H + d I)^-1 with H = X_q^T X_q, C = X_fp^T X_q (both scaled as GPTQ's H). The ridge
    pulls towards W, not 0: where X_fp = X_q (the first linear) W* = W. `beta` blends W + beta (W* - W)."""
    h, _ = dampened_hessian(hessian.double(), weight, percdamp)
    delta = torch.linalg.solve(h, (weight.double() @ (cross.double() - hessian.double())).T).T  # h symmetric
    return (weight.double() + beta * delta).to(weight.dtype)


def pick_damp(weight: torch.Tensor, fit: torch.Tensor, held_out: torch.Tensor, spec: GPTQSpec) -> float:
    """The dampening of DAMPS whose GPTQ on `fit` has the least output error on `held_out` inputs (clip
    search off in these trials: it is the slow part, and moves every candidate alike)."""
    errors = {}
    for damp in DAMPS:
        diff = weight - gptq_quantize(weight, fit, replace(spec, percdamp=damp, clip_search=False)).dequantize()
        errors[damp] = float(((diff @ held_out) * diff).sum())
    return min(errors, key=errors.__getitem__)
