"""`$ref` resolution inside one schema document: JSON pointers, `$anchor`s, and the `$id` / draft-4 `id`
of the root or of a subschema. References to other documents are refused (nothing is fetched)."""
from __future__ import annotations

from typing import Any
from urllib.parse import unquote

# keywords whose values are data, not subschemas: an "id" inside them names nothing
_DATA_KEYWORDS = frozenset({"enum", "const", "default", "examples", "example"})


# drafts where a `$ref` replaces the object holding it ("all other properties in a $ref object MUST be ignored",
# draft-04 to draft-07); from 2019-09 on its siblings apply beside it, as an allOf (the default where `$schema`
# names no draft)
_REF_ALONE_DRAFTS = ("draft-03/", "draft-04/", "draft-06/", "draft-07/")
# ... but a pointer may still lead into these, and they assert nothing
_KEPT_BESIDE_REF = frozenset({"$ref", "definitions", "$defs", "$id", "id", "$schema"})


def ref_siblings_dropped(root: dict | bool) -> dict | bool:
    """`root` as its draft reads it: under draft-04 to 07 (`$schema`), every `$ref` object without the keywords
    beside the reference (a validator of that draft ignores them: `{"$ref": ..., "enum": [...]}` is the target
    alone); other documents as they are."""
    if not isinstance(root, dict) or not any(d in str(root.get("$schema", "")) for d in _REF_ALONE_DRAFTS):
        return root

    def read(node: object) -> object:
        if isinstance(node, list):
            return [read(item) for item in node]
        if not isinstance(node, dict):
            return node
        alone = isinstance(node.get("$ref"), str)  # a properties map may name a member "$ref" (its schema a dict)
        return {k: v if k in _DATA_KEYWORDS else read(v) for k, v in node.items() if not alone or k in _KEPT_BESIDE_REF}
    return read(root)  # type: ignore[return-value]  # a dict stays a dict


class RefResolver:
    def __init__(self, root: object):
        self.root = root
        self.ids: dict[str, Any] = {}  # "$id"/"id" values (without a trailing '#') and "#anchor" -> subschema
        self._index(root, top=True)

    def _index(self, node: object, top: bool = False) -> None:
        if isinstance(node, list):
            for item in node:
                self._index(item)
            return
        if not isinstance(node, dict):
            return
        for key in ("$id", "id"):
            if isinstance(node.get(key), str):
                self.ids.setdefault(node[key].rstrip("#"), node)
        if isinstance(node.get("$anchor"), str):
            self.ids.setdefault("#" + node["$anchor"], node)
        for key, value in node.items():
            if key not in _DATA_KEYWORDS and not (key in ("$id", "id") and isinstance(value, str)):
                self._index(value)

    def resolve(self, ref: object, path: str) -> tuple[str, object]:
        """(a key naming the target, the target schema)."""
        if not isinstance(ref, str):
            raise ValueError(f"json_schema $ref at {path} must be a string, got {ref!r}")
        base, _, fragment = ref.partition("#")
        doc = self._document(base, ref, path)
        if fragment and not fragment.startswith("/"):  # a plain-name fragment: an anchor
            target = self.ids.get("#" + fragment) or self.ids.get(ref)
            if target is None:
                raise ValueError(f"json_schema $ref {ref!r} at {path} does not resolve")
            return f"#anchor:{fragment}", target
        node = doc
        for part in fragment.lstrip("/").split("/") if fragment else []:
            part = unquote(part).replace("~1", "/").replace("~0", "~")  # a URI fragment: %-escapes first
            if isinstance(node, dict) and part in node:
                node = node[part]
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                raise ValueError(f"json_schema $ref {ref!r} at {path} does not resolve")
        prefix = "" if doc is self.root else f"{id(doc)}:"
        return f"#{prefix}{fragment}", node

    def _document(self, base: str, ref: str, path: str) -> object:
        if not base:
            return self.root
        if base in self.ids:
            return self.ids[base]
        for key, node in self.ids.items():  # a relative reference to an id given as a full URI
            if not key.startswith("#") and (key.endswith("/" + base) or base.endswith("/" + key)):
                return node
        raise ValueError(f"json_schema $ref {ref!r} at {path}: only references inside the schema are supported "
                         "(no document is fetched)")
