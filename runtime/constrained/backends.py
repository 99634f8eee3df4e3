"""Peer grammar engines behind our Constraint protocol: `grammar_backend` xgrammar or llguidance.

Both libraries keep one mutable matcher per request (accept a token, roll back n tokens, fill a bitmask);
our protocol has immutable states, because a draft tree asks for the mask after each of its nodes and a
rejected branch is simply dropped. So a state here is a node of the request's token tree (`Node`), and
the request's one library matcher (its `Cursor`) is moved to whichever node is asked about: rolled back
to the common ancestor, then fed the tokens down to it. Draft-tree pruning, verification and jump-forward
(the library's forced string) then run exactly as with ours. `initial()` starts a new tree with its own
matcher: a compiled constraint is shared by requests, a tree belongs to one.

Tokens are our vocabulary's (TokenVocab: the tokenizer's bytes per id); special tokens are never allowed
(EOS only where the output may end, which Matcher adds), as with ours.
"""
from __future__ import annotations

import importlib.util
import json
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from .ebnf import ROOT
from .masks.vocab import TokenVocab
from .matcher import Constraint
from .structural_tag import StructuralTag, parse_structural_tag

EXTRA = "grammar"  # pyproject.toml's optional extra that installs both peers
_PACKAGES = {"xgrammar": "xgrammar", "llguidance": "llguidance"}


def check_installed(backend: str) -> None:
    """ValueError naming the extra when the backend's package is missing (cheap: nothing is imported)."""
    package = _PACKAGES[backend]
    if importlib.util.find_spec(package) is None:
        raise ValueError(f"grammar_backend={backend!r} needs the {package} package, which is not installed: "
                         f"pip install 'radixlang[{EXTRA}]' (or pip install --no-deps {package})")


Encode = Callable[[str], list[int]]  # the tokenizer's text -> ids, no special tokens added


def peer_compiler(backend: str, vocab: TokenVocab, json_whitespace: str | None,
                  encode: Encode | None = None) -> "PeerCompiler":
    """`encode`: the tokenizer, which llguidance asks how forced text is tokenized (it allows only that
    split of a forced string); without it, a greedy longest match over the vocabulary."""
    check_installed(backend)
    if backend == "xgrammar":
        return XgrammarCompiler(vocab, json_whitespace)
    return LlguidanceCompiler(vocab, json_whitespace, encode)


@dataclass(eq=False, slots=True)
class Node:
    """A constraint state: the request's tokens so far, as a node of its token tree (hashed by identity)."""

    cursor: "Cursor"
    parent: "Node | None" = None
    edge: int | bytes = b""  # the token (or, from advance_bytes, the bytes) that led here
    steps: int = 0  # library steps that edge took (what rolling it back costs)
    level: int = 0  # edges from the root
    children: dict[int | bytes, "Node | None"] = field(default_factory=dict)  # None: refused


@dataclass(eq=False, slots=True)
class Cursor:
    """One request's library matcher and the node it stands at; the last mask it filled."""

    matcher: Any
    words: np.ndarray  # the library fills its bitmask here: uint8, V/32 int32 words' bytes
    at: Node | None = None
    bits_at: Node | None = None
    bits: np.ndarray | None = None


class PeerConstraint(ABC):
    """A compiled peer grammar as a Constraint over `Node` states; subclasses drive one library's matcher."""

    unenforced: tuple[str, ...] = ()

    def __init__(self, vocab: TokenVocab):
        self.vocab = vocab
        self._nbytes = -(-vocab.size // 8)
        self._tail = np.uint8((1 << (vocab.size % 8)) - 1 if vocab.size % 8 else 0xFF)  # the last byte's real bits
        self._refused = frozenset(vocab.special_ids) | frozenset(vocab.end_ids)  # Matcher adds EOS itself
        self._end_bits = [(t >> 3, np.uint8(~(1 << (t & 7)) & 0xFF)) for t in vocab.end_ids]

    # ---- one library -------------------------------------------------------------------------------
    @abstractmethod
    def _new_matcher(self) -> Any: ...  # noqa: ANN401 - the library's matcher

    @abstractmethod
    def _accept_token(self, m: Any, token: int) -> bool: ...  # noqa: ANN401 - unchanged when it refuses

    @abstractmethod
    def _accept_bytes(self, m: Any, data: bytes) -> int: ...  # noqa: ANN401 - steps taken; -1: refused, unchanged

    @abstractmethod
    def _rollback(self, m: Any, steps: int) -> None: ...  # noqa: ANN401

    @abstractmethod
    def _fill_words(self, m: Any, words: np.ndarray) -> None: ...  # noqa: ANN401 - little-endian bits

    @abstractmethod
    def _can_end(self, m: Any) -> bool: ...  # noqa: ANN401

    @abstractmethod
    def _forced(self, m: Any) -> bytes: ...  # noqa: ANN401

    # ---- the Constraint protocol -------------------------------------------------------------------
    def initial(self) -> Node:
        root = Node(Cursor(self._new_matcher(), np.zeros(-(-self.vocab.size // 32) * 4, np.uint8)))
        root.cursor.at = root
        return root

    def advance(self, state: Node, token_id: int) -> Node | None:
        if token_id in state.children:
            return state.children[token_id]
        ok = (token_id not in self._refused and bool(self.vocab.bytes_of(token_id))
              and self._accept_token(self._goto(state), token_id))
        return self._child(state, token_id, 1 if ok else -1)

    def advance_bytes(self, state: Node, data: bytes) -> Node | None:
        if not data:
            return state
        if data in state.children:
            return state.children[data]
        return self._child(state, data, self._accept_bytes(self._goto(state), data))

    def allowed(self, state: Node) -> np.ndarray:
        return np.unpackbits(self.allowed_bits(state), count=self.vocab.size, bitorder="little").view(bool).copy()

    def allowed_bits(self, state: Node) -> np.ndarray:
        cursor = state.cursor
        if cursor.bits_at is not state:  # one mask kept: a step asks for it, then for is_complete
            self._fill_words(self._goto(state), cursor.words)
            bits = cursor.words[:self._nbytes].copy()
            bits[-1] &= self._tail
            for byte, keep in self._end_bits:
                bits[byte] &= keep
            cursor.bits_at, cursor.bits = state, bits
        assert cursor.bits is not None
        return cursor.bits

    def can_end(self, state: Node) -> bool:
        return self._can_end(self._goto(state))

    def forced_bytes(self, state: Node, limit: int) -> bytes:
        return self._forced(self._goto(state))[:limit]

    # ---- moving the matcher ------------------------------------------------------------------------
    def _child(self, state: Node, edge: int | bytes, steps: int) -> Node | None:
        """The node after `edge` (the matcher has just taken it, in `steps` steps; -1: refused)."""
        if steps < 0:
            state.children[edge] = None
            return None
        child = Node(state.cursor, state, edge, steps, state.level + 1)
        state.children[edge] = child
        state.cursor.at = child
        return child

    def _goto(self, node: Node) -> Any:  # noqa: ANN401 - the library's matcher, standing at `node`
        cursor = node.cursor
        at = cursor.at
        assert at is not None
        if at is node:
            return cursor.matcher
        back, down, a, b = 0, [], at, node
        while a.level > b.level:
            back += a.steps
            a = a.parent  # type: ignore[assignment]  # level > 0: a parent
        while b.level > a.level:
            down.append(b)
            b = b.parent  # type: ignore[assignment]
        while a is not b:
            back += a.steps
            down.append(b)
            a, b = a.parent, b.parent  # type: ignore[assignment]
        m = cursor.matcher
        if back:
            self._rollback(m, back)
        for n in reversed(down):  # each edge was accepted once from this very state: it is again
            ok = (self._accept_token(m, n.edge) if isinstance(n.edge, int)
                  else self._accept_bytes(m, n.edge) == n.steps)
            assert ok, "a node's edge is accepted again from its parent"
        cursor.at = node
        return m


class PeerCompiler(ABC):
    """One library's compiler for our constraint kinds, against one vocabulary."""

    name: str

    @abstractmethod
    def compile(self, kind: str, spec: object, text: str) -> Constraint: ...

    def unsupported(self, feature: str, hint: str = "") -> ValueError:
        return ValueError(f"grammar_backend={self.name!r} does not support {feature}"
                          + (f": {hint}" if hint else "; the radixlang backend does"))


def _compact_json(json_whitespace: str | None, backend: str) -> None:
    if json_whitespace is not None:
        raise ValueError(f"grammar_backend={backend!r} writes compact JSON only: unset "
                         "constrained_json_whitespace_pattern")


# ---- xgrammar ---------------------------------------------------------------------------------------
class XgrammarConstraint(PeerConstraint):
    def __init__(self, compiled: Any, vocab: TokenVocab):  # noqa: ANN401 - xgrammar.CompiledGrammar
        super().__init__(vocab)
        import xgrammar as xgr

        self._xgr = xgr
        self.compiled = compiled

    def _new_matcher(self) -> Any:  # noqa: ANN401
        return self._xgr.GrammarMatcher(self.compiled)

    def _accept_token(self, m: Any, token: int) -> bool:  # noqa: ANN401
        return bool(m.accept_token(token))

    def _accept_bytes(self, m: Any, data: bytes) -> int:  # noqa: ANN401
        return 1 if m.accept_string(data) else -1

    def _rollback(self, m: Any, steps: int) -> None:  # noqa: ANN401
        m.rollback(steps)

    def _fill_words(self, m: Any, words: np.ndarray) -> None:  # noqa: ANN401
        m.fill_next_token_bitmask(words.view(np.int32).reshape(1, -1))

    def _can_end(self, m: Any) -> bool:  # noqa: ANN401
        return bool(m.is_completed())

    def _forced(self, m: Any) -> bytes:  # noqa: ANN401
        return m.find_jump_forward_string().encode()


class XgrammarCompiler(PeerCompiler):
    name = "xgrammar"

    def __init__(self, vocab: TokenVocab, json_whitespace: str | None, threads: int | None = None):
        """`threads`: xgrammar's compile threads (its default: 8)."""
        _compact_json(json_whitespace, self.name)
        import xgrammar as xgr

        self.vocab = vocab
        rows = set(vocab.ids.tolist())
        encoded = [vocab.bytes_of(i) if i in rows else b"" for i in range(vocab.size)]  # b"": special, never allowed
        info = xgr.TokenizerInfo(encoded, xgr.VocabType.RAW, vocab_size=vocab.size, stop_token_ids=list(vocab.end_ids))
        options: dict[str, Any] = {} if threads is None else {"max_threads": threads}
        self._compiler = xgr.GrammarCompiler(info, cache_enabled=False, **options)  # ours caches compiled constraints

    def compile(self, kind: str, spec: object, text: str) -> Constraint:
        c = self._compiler
        try:
            if kind in ("json_schema", "json_schema_strict"):  # the schema's own semantics, or OpenAI's strict form
                compiled = c.compile_json_schema(text, any_whitespace=False, separators=(",", ":"),
                                                 strict_mode=kind == "json_schema_strict")
            elif kind == "regex":
                compiled = c.compile_regex(text)
            elif kind == "ebnf":
                compiled = c.compile_grammar(text, root_rule_name=ROOT)
            elif kind == "structural_tag":
                compiled = c.compile_structural_tag(_xgrammar_tag(parse_structural_tag(spec)))
            else:
                raise self.unsupported(f"{kind} constraints", "use ebnf, or the radixlang or llguidance backend")
        except (RuntimeError, TypeError) as e:  # the library's refusals (its own exception types derive from these)
            raise ValueError(f"{kind} refused by xgrammar: {e}") from None
        return XgrammarConstraint(compiled, self.vocab)


def _xgrammar_tag(tag: StructuralTag) -> str:
    """Our structural tag in XGrammar's own format (the spelling ours accepts as `format`)."""
    tags = [{"type": "tag", "begin": t.begin, "end": t.end,
             "content": {"type": "json_schema", "json_schema": t.schema}} for t in tag.tags]
    if tag.triggers is None:
        fmt: dict[str, Any] = {"type": "tags_with_separator", "tags": tags, "separator": tag.separator}
    else:
        fmt = {"type": "triggered_tags", "triggers": list(tag.triggers), "tags": tags}
    fmt.update(at_least_one=tag.at_least_one, stop_after_first=tag.stop_after_first)
    return json.dumps({"type": "structural_tag", "format": fmt})


# ---- llguidance -------------------------------------------------------------------------------------
class LlguidanceConstraint(PeerConstraint):
    def __init__(self, prototype: Any, tokenizer: Any, vocab: TokenVocab):  # noqa: ANN401 - LLMatcher, LLTokenizer
        super().__init__(vocab)
        self._prototype, self._tokenizer = prototype, tokenizer

    def _new_matcher(self) -> Any:  # noqa: ANN401
        return self._prototype.deep_copy()  # the grammar is built once, at compile

    def _accept_token(self, m: Any, token: int) -> bool:  # noqa: ANN401
        return bool(m.try_consume_tokens([token]) == 1)  # consume_token would leave the matcher in error

    def _accept_bytes(self, m: Any, data: bytes) -> int:  # noqa: ANN401
        tokens = self._tokenizer.tokenize_bytes(data)
        taken = m.try_consume_tokens(tokens)
        if taken == len(tokens):
            return taken
        if taken:
            m.rollback(taken)
        return -1

    def _rollback(self, m: Any, steps: int) -> None:  # noqa: ANN401
        m.rollback(steps)

    def _fill_words(self, m: Any, words: np.ndarray) -> None:  # noqa: ANN401
        m.unsafe_compute_mask_ptr(words.ctypes.data, words.nbytes)

    def _can_end(self, m: Any) -> bool:  # noqa: ANN401
        return bool(m.is_accepting())

    def _forced(self, m: Any) -> bytes:  # noqa: ANN401
        return bytes(m.compute_ff_bytes())


@dataclass(eq=False)
class _Tokenizer:
    """What llguidance's TokenizerWrapper reads: the vocabulary's bytes, and an encoder (the tokenizer's;
    else a greedy longest match)."""

    tokens: list[bytes]
    eos_token_id: int
    special_token_ids: list[int]
    encode: Encode | None
    bos_token_id: int | None = None
    _by_bytes: dict[bytes, int] = field(default_factory=dict)
    _longest: int = 1

    def __post_init__(self) -> None:
        special = set(self.special_token_ids)
        for i, b in enumerate(self.tokens):
            if b and i not in special:
                self._by_bytes.setdefault(b, i)
        self._longest = max(map(len, self._by_bytes))

    def __call__(self, data: bytes) -> list[int]:
        if self.encode is not None:
            try:
                return self.encode(data.decode())
            except UnicodeDecodeError:  # part of a character: no text to tokenize, the greedy split does
                pass
        out, i = [], 0
        while i < len(data):
            for n in range(min(self._longest, len(data) - i), 0, -1):
                token = self._by_bytes.get(data[i:i + n])
                if token is not None:
                    out.append(token)
                    i += n
                    break
            else:
                raise ValueError(f"byte {data[i]:#x} is no token of the vocabulary")
        return out


class LlguidanceCompiler(PeerCompiler):
    name = "llguidance"

    def __init__(self, vocab: TokenVocab, json_whitespace: str | None, encode: Encode | None):
        _compact_json(json_whitespace, self.name)
        import llguidance

        self._llg = llguidance
        self.vocab = vocab
        tokens = [vocab.bytes_of(i) for i in range(vocab.size)]
        special = sorted(set(vocab.special_ids) | set(vocab.end_ids) | {i for i, b in enumerate(tokens) if not b})
        wrapper = llguidance.TokenizerWrapper(_Tokenizer(tokens, vocab.end_ids[0] if vocab.end_ids else 0, special, encode))
        self.tokenizer = llguidance.LLTokenizer(wrapper, n_vocab=vocab.size, eos_token=list(vocab.end_ids) or None)

    def compile(self, kind: str, spec: object, text: str) -> Constraint:
        m = self._llg.LLMatcher
        if kind in ("json_schema", "json_schema_strict"):  # no strict form in llguidance: the schema's semantics
            grammar = m.grammar_from_json_schema(text, overrides={"whitespace_flexible": False, "item_separator": ",",
                                                                  "key_separator": ":"})
        elif kind == "regex":
            grammar = m.grammar_from_regex(text)
        elif kind == "grammar":
            grammar = m.grammar_from_lark(text)
        elif kind == "ebnf":
            from llguidance.gbnf_to_lark import gbnf_to_lark

            try:
                grammar = m.grammar_from_lark(gbnf_to_lark(text))
            except Exception as e:  # noqa: BLE001 - the converter's refusals, of whatever type
                raise ValueError(f"ebnf refused by llguidance: {e}") from None
        elif kind == "structural_tag":
            grammar = m.grammar_from_lark(self._lark_tags(parse_structural_tag(spec)))
        else:
            raise self.unsupported(f"{kind} constraints")
        prototype = m(self.tokenizer, grammar, log_level=0)
        if prototype.is_error():
            raise ValueError(f"{kind} refused by llguidance: {prototype.get_error()}")
        return LlguidanceConstraint(prototype, self.tokenizer, self.vocab)

    def _lark_tags(self, tag: StructuralTag) -> str:
        """llguidance's own structural tags (StructTag): free text with triggered tags, nothing more."""
        if tag.triggers is None or tag.at_least_one or tag.stop_after_first:
            raise self.unsupported("structural tags with a separator, at_least_one or stop_after_first",
                                   "only triggered tags; use the radixlang or xgrammar backend")
        tags = []
        for t in tag.tags:
            trigger = next((g for g in tag.triggers if t.begin.startswith(g)), None)
            if trigger is None:
                raise ValueError(f"structural tag begin {t.begin!r} starts with none of the triggers")
            tags.append(self._llg.StructTag(trigger=trigger, begin=t.begin, grammar=json.dumps(t.schema), end=t.end))
        return self._llg.StructTag.to_grammar(tags, assume_special=False)

