"""Tokenizer + chat template, built from GGUF metadata or an HF folder's tokenizer.json."""
from __future__ import annotations

import functools
import json
import logging
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Sequence

from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

if TYPE_CHECKING:
    import jinja2

logger = logging.getLogger(__name__)

# llama.cpp's pre-tokenizer names -> the split regex HF uses for that family (None: GPT-2's own).
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_GGUF_PRE_SPLITS: dict[str, str | None] = {
    "default": None,
    "gpt2": None,
    "smollm": None,  # GPT-2 regex after splitting digits one by one
    "llama-bpe": _LLAMA3_SPLIT,
    "llama3": _LLAMA3_SPLIT,
    "qwen2": _QWEN2_SPLIT,
}
_GGUF_CONTROL, _GGUF_USER_DEFINED = 3, 4


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable-character table used by byte-level BPE."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


_BYTE_DECODER = {c: b for b, c in bytes_to_unicode().items()}


def _render_env() -> jinja2.Environment:
    """The environment transformers renders chat templates in: same globals, filters and loop controls.
    (jinja2 is imported here, at the first chat template: ~0.12 s that a start without one does not pay.)"""
    import jinja2.sandbox

    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                       extensions=["jinja2.ext.loopcontrols"])

    def raise_exception(message: str) -> None:
        raise ValueError(f"chat template error: {message}")

    def tojson(x: object, ensure_ascii: bool = False, indent: int | None = None,
               separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)  # Llama 3.2 dates its prompts
    env.filters["tojson"] = tojson
    return env


@dataclass
class Tokenizer:
    """A `tokenizers.Tokenizer` plus the special-token facts and chat template the engine needs."""

    hf: HFTokenizer = field(repr=False)
    eos_token_ids: tuple[int, ...]
    bos_token_id: int | None = None
    add_bos: bool = False
    chat_template: str | None = field(default=None, repr=False)
    byte_level: bool = True
    # decode([id]) by skip_special_tokens (False, True) -> id -> text: see decode_token
    _token_texts: tuple[dict[int, str], dict[int, str]] = field(
        default_factory=lambda: ({}, {}), init=False, repr=False, compare=False)

    # ---- construction -------------------------------------------------------------------
    @classmethod
    def from_gguf_metadata(cls, meta: dict[str, Any]) -> "Tokenizer":
        model = meta.get("tokenizer.ggml.model")
        if model != "gpt2":
            raise ValueError(
                f"GGUF tokenizer model {model!r} is not supported; only byte-level BPE ('gpt2') is. "
                "Load an HF folder with tokenizer.json instead."
            )
        tokens: list[str] = list(meta["tokenizer.ggml.tokens"])
        types = list(meta.get("tokenizer.ggml.token_type", [1] * len(tokens)))
        merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
        vocab = {tok: i for i, tok in enumerate(tokens)}
        hf = HFTokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
        hf.pre_tokenizer = _gguf_pre_tokenizer(meta.get("tokenizer.ggml.pre", "default"))
        hf.decoder = decoders.ByteLevel()
        hf.add_special_tokens(
            [
                AddedToken(tokens[i], special=True, normalized=False)
                for i, t in enumerate(types)
                if t in (_GGUF_CONTROL, _GGUF_USER_DEFINED)
            ]
        )
        eos = meta.get("tokenizer.ggml.eos_token_id")
        eot = meta.get("tokenizer.ggml.eot_token_id")
        eos_ids = tuple(dict.fromkeys(i for i in (eos, eot) if i is not None))
        return cls(
            hf=hf,
            eos_token_ids=eos_ids,
            bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
            add_bos=bool(meta.get("tokenizer.ggml.add_bos_token", False)),
            chat_template=meta.get("tokenizer.chat_template"),
        )

    @classmethod
    def from_hf_dir(cls, path: str | Path, eos_token_ids: Sequence[int] = ()) -> "Tokenizer":
        path = Path(path)
        hf = HFTokenizer.from_file(str(path / "tokenizer.json"))
        hf.no_padding()
        hf.no_truncation()
        cfg = _read_json(path / "tokenizer_config.json")
        special = {k: _token_content(cfg.get(k)) for k in ("bos_token", "eos_token")}
        eos_ids: list[int | None] = list(eos_token_ids)  # None: an eos token the vocab lacks (dropped below)
        if not eos_ids and special["eos_token"] is not None:
            eos_ids = [hf.token_to_id(special["eos_token"])]
        bos_id = hf.token_to_id(special["bos_token"]) if special["bos_token"] else None
        template = cfg.get("chat_template")
        if template is None and (path / "chat_template.jinja").exists():
            template = (path / "chat_template.jinja").read_text()
        if isinstance(template, list):  # named templates: take the default one
            template = next((t["template"] for t in template if t.get("name") == "default"), None)
        tok_json = _read_json(path / "tokenizer.json")
        byte_level = (tok_json.get("decoder") or {}).get("type") == "ByteLevel"
        return cls(
            hf=hf,
            eos_token_ids=tuple(i for i in eos_ids if i is not None),
            bos_token_id=bos_id,
            add_bos=bool(cfg.get("add_bos_token", False)) and bos_id is not None,
            chat_template=template,
            byte_level=byte_level,
        )

    # ---- encode / decode ------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return self.hf.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids = self.hf.encode(text, add_special_tokens=False).ids
        return self._with_bos(ids) if add_special_tokens else ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """`encode` of each text. Unlike `encode`, the tokenizer lets go of the GIL meanwhile, so other
        threads (a server's event loop) keep running while a long text is tokenised."""
        return [self._with_bos(e.ids) for e in self.hf.encode_batch(list(texts), add_special_tokens=False)]

    def _with_bos(self, ids: list[int]) -> list[int]:
        if self.add_bos and self.bos_token_id is not None and (not ids or ids[0] != self.bos_token_id):
            return [self.bos_token_id] + ids
        return ids

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        return self.hf.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def decode_token(self, token_id: int, skip_special_tokens: bool = True) -> str:
        """decode([token_id]), memoized: incremental detokenization asks for it about once per new token."""
        texts = self._token_texts[skip_special_tokens]
        text = texts.get(token_id)
        if text is None:
            text = texts[token_id] = self.decode([token_id], skip_special_tokens)
        return text

    def id_to_token(self, token_id: int) -> str | None:
        return self.hf.id_to_token(token_id)

    @cached_property
    def special_token_ids(self) -> frozenset[int]:
        return frozenset(
            i for i, tok in self.hf.get_added_tokens_decoder().items() if tok.special
        )

    @cached_property
    def token_bytes(self) -> list[bytes]:
        """The raw bytes each token id decodes to (special tokens: their literal text)."""
        out: list[bytes] = []
        specials = self.special_token_ids
        for i in range(self.vocab_size):
            tok = self.hf.id_to_token(i)
            if tok is None:
                out.append(b"")
            elif i in specials:
                out.append(tok.encode())
            elif self.byte_level:
                out.append(bytes(_BYTE_DECODER.get(c, 0) for c in tok) if all(
                    c in _BYTE_DECODER for c in tok) else tok.encode())
            else:
                out.append(_sentencepiece_bytes(tok))
        return out

    # ---- chat ------------------------------------------------------------------------------
    def apply_chat_template(
        self, messages: Sequence[dict[str, Any]], add_generation_prompt: bool = True,
        image_placeholder: str | None = None, **kwargs: object
    ) -> str:
        if not self.chat_template:
            raise ValueError("this model has no chat template; pass a plain prompt instead")
        return render_chat_template(self.chat_template, messages, add_generation_prompt, image_placeholder,
                                    bos_token=self.bos_token, eos_token=self.eos_token, **kwargs)

    @property
    def bos_token(self) -> str:
        return self._special_text(self.bos_token_id)

    @property
    def eos_token(self) -> str:
        return self._special_text(self.eos_token_ids[0] if self.eos_token_ids else None)

    def _special_text(self, token_id: int | None) -> str:
        return "" if token_id is None else (self.hf.id_to_token(token_id) or "")


def render_chat_template(template: str, messages: Sequence[dict[str, Any]], add_generation_prompt: bool = True,
                         image_placeholder: str | None = None, **kwargs: object) -> str:
    """Renders a Jinja chat template (HF conventions) in a sandbox; also used without a Tokenizer.

    A message's content is a string or a list of OpenAI-style parts (`{"type": "text", "text"}`,
    `{"type": "image"}`). Each template gets the form it reads: parts for templates that iterate over
    content parts (llava-hf's), a string for the others, with `image_placeholder` where each image goes."""
    for m in messages:
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            raise ValueError(f"each chat message needs 'role' and 'content', got {m!r}")
    as_parts = _reads_content_parts(template)
    shaped = [{**m, "content": _shaped_content(m["content"], as_parts, image_placeholder)} for m in messages]
    return _compiled_template(template).render(
        messages=[_with_reasoning_aliases(m) for m in shaped], add_generation_prompt=add_generation_prompt,
        **kwargs)


_PROBE = "\ue000radixlang-probe\ue001"


@functools.lru_cache(maxsize=16)
def _reads_content_parts(template: str) -> bool:
    """Whether the template drops string content but renders a text part's: it reads content as a list
    of parts (judged by rendering, as vLLM's content-format detection does)."""
    def renders(content: object) -> bool:
        try:
            text = _compiled_template(template).render(messages=[{"role": "user", "content": content}],
                                                       add_generation_prompt=False)
        except Exception:  # noqa: BLE001 - a probe: a template that fails on this form does not read it
            return False
        return _PROBE in text

    return not renders(_PROBE) and renders([{"type": "text", "text": _PROBE}])


def _shaped_content(content: str | list[dict[str, Any]] | None, as_parts: bool,
                    image_placeholder: str | None) -> str | list[dict[str, Any]] | None:
    if content is None or isinstance(content, str):
        return [{"type": "text", "text": content}] if as_parts and content else content
    if as_parts:
        return content
    if image_placeholder is None and any(part.get("type") == "image" for part in content):
        raise ValueError("a message has an image part, but this model has no image placeholder")
    placeholder = image_placeholder or ""  # "" is never used: without a placeholder no part is an image
    return "\n".join(placeholder if part.get("type") == "image" else part["text"] for part in content)


_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")  # the first is what templates read


def _with_reasoning_aliases(message: dict[str, Any]) -> dict[str, Any]:
    """Reasoning sent under any of its names reaches templates as `reasoning_content` (and `thinking`),
    as transformers passes it."""
    reasoning = next((message[k] for k in _REASONING_FIELDS if message.get(k) is not None), None)
    if reasoning is None:
        return message
    return {"thinking": reasoning, **message, "reasoning_content": reasoning}


@functools.lru_cache(maxsize=16)
def _compiled_template(template: str) -> jinja2.Template:
    return _render_env().from_string(template)


def _gguf_pre_tokenizer(pre: str) -> pre_tokenizers.PreTokenizer:
    if pre not in _GGUF_PRE_SPLITS:
        logger.warning("unknown GGUF pre-tokenizer %r; using GPT-2's split", pre)
    split = _GGUF_PRE_SPLITS.get(pre)
    steps: list[pre_tokenizers.PreTokenizer] = []
    if pre == "smollm":
        steps.append(pre_tokenizers.Digits(individual_digits=True))
    if split is None:
        steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True))
    else:
        steps.append(pre_tokenizers.Split(Regex(split), behavior="isolated"))
        steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False))
    return pre_tokenizers.Sequence(steps)


def _sentencepiece_bytes(tok: str) -> bytes:
    if len(tok) == 6 and tok.startswith("<0x") and tok.endswith(">"):
        return bytes([int(tok[3:5], 16)])
    return tok.replace("\u2581", " ").encode()


def _token_content(tok: str | dict[str, Any] | None) -> str | None:
    return tok.get("content") if isinstance(tok, dict) else tok


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.exists() else {}
