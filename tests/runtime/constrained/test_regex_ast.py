"""regex_ast's per-node answers (`size`, `refs`): right, and kept on the node rather than in a memo that holds
every tree it has seen alive (a server compiling schemas then paid a ~230 ms full collector pass per ~1M
objects held)."""
from __future__ import annotations

import gc
import random
import sys

from radixlang.runtime.constrained.compiler import ConstraintCompiler
from radixlang.runtime.constrained.regex import regex_ast as ra


def plain_size(node: ra.Node) -> int:
    """size() written from its definition, nothing remembered."""
    if isinstance(node, ra.Chars | ra.Ref):
        return 1
    if isinstance(node, ra.Seq | ra.Alt):
        return 1 + sum(plain_size(n) for n in node.items)
    if isinstance(node, ra.Repeat):
        return 1 + plain_size(node.item) * max(node.min + 1 if node.max is None else node.max, 1)
    if isinstance(node, ra.Bounded):
        return plain_size(node.item) * node.max_bytes
    assert isinstance(node, ra.Graph)
    return node.num_states + sum(plain_size(n) for _, n, _ in node.edges)


def plain_refs(node: ra.Node) -> set[str]:
    if isinstance(node, ra.Ref):
        return {node.name}
    return set().union(*(plain_refs(n) for n in ra.children(node)))


def random_tree(rng: random.Random, depth: int, shared: list[ra.Node]) -> ra.Node:
    if depth == 0 or rng.random() < 0.2:
        if shared and rng.random() < 0.3:
            return rng.choice(shared)  # a subtree met again, as schemas share theirs
        return ra.Ref(rng.choice("abcd")) if rng.random() < 0.3 else ra.Chars(((97, 97 + rng.randrange(5)),))
    kind = rng.randrange(5)
    parts = [random_tree(rng, depth - 1, shared) for _ in range(rng.randint(1, 3))]
    if kind == 0:
        node: ra.Node = ra.Seq(tuple(parts))
    elif kind == 1:
        node = ra.Alt(tuple(parts))
    elif kind == 2:
        node = ra.Repeat(parts[0], rng.randrange(3), rng.choice([None, 2, 5]))
    elif kind == 3:
        node = ra.Bounded(parts[0], rng.randint(1, 4))
    else:
        node = ra.Graph(len(parts) + 1, tuple((i, p, i + 1) for i, p in enumerate(parts)), (len(parts),))
    shared.append(node)
    return node


def test_size_and_refs_match_their_definitions_on_shared_trees():
    rng = random.Random(0)
    for _ in range(200):
        shared: list[ra.Node] = []
        tree = random_tree(rng, 5, shared)
        for node in [tree, *shared]:  # every subtree, asked in turn (answers kept on the way must stay right)
            assert ra.size(node) == plain_size(node)
            assert ra.refs(node) == plain_refs(node)


def test_answers_keep_no_tree_alive():
    tree = ra.Seq((ra.Repeat(ra.Ref("x"), 0, None), ra.Alt((ra.Chars(((48, 57),)), ra.Ref("y")))))
    held = sys.getrefcount(tree)
    assert ra.refs(tree) == {"x", "y"} and ra.size(tree) == plain_size(tree)
    assert sys.getrefcount(tree) == held, "a memo holds the tree"


def test_compiled_schemas_leave_few_objects_for_the_collector(vocab):
    """Schemas compiled and dropped leave next to nothing tracked by the cyclic collector: before, every tree
    a compile had built stayed alive in the answers' memos (~3,000 objects a schema on JSONSchemaBench)."""
    def schema(i: int) -> dict:
        props = {f"field_{i}_{j}": {"type": "string", "pattern": f"^[a-z]{{{j + 1},{j + 9}}}$"} for j in range(12)}
        props[f"nested_{i}"] = {"type": "array", "items": {"type": "object", "properties": dict(list(props.items())[:4])}}
        return {"type": "object", "properties": props, "required": [f"field_{i}_0"]}

    def compile_some(start: int) -> None:
        for i in range(start, start + 10):
            c = ConstraintCompiler(lambda: vocab).compile("json_schema", schema(i))
            c.allowed(c.initial())

    compile_some(0)  # module-level tables built once (vocabulary classes, decoders): not what is measured
    gc.collect()
    before = len(gc.get_objects())
    compile_some(100)
    gc.collect()
    grown = len(gc.get_objects()) - before
    assert grown < 10 * 150, f"{grown} objects left tracked by 10 compiled and dropped schemas"
