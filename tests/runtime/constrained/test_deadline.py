"""The compile deadline: past it a compile is refused with an error naming the deadline, and nothing it left
behind changes what later compiles produce."""
from __future__ import annotations

import numpy as np
import pytest

from radixlang.runtime.constrained import deadline
from radixlang.runtime.constrained.compiler import ConstraintCompiler

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                           "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}}},
          "required": ["name"]}


@pytest.mark.parametrize("kind, spec", [("json_schema", SCHEMA), ("regex", "[a-z]{3,9}@[a-z]+"),
                                        ("grammar", 'start: "[" X ("," X)* "]"\nX: /[0-9]+/\n')])
def test_a_compile_past_its_deadline_is_refused_and_the_compiler_stays_sound(vocab, kind, spec):
    late = ConstraintCompiler(lambda: vocab, compile_timeout=1e-9)
    with pytest.raises(ValueError, match=r"did not compile within the compile deadline of 1e-09 s"):
        late.compile(kind, spec)
    late.compile_timeout = None  # the same compiler (its automata cache holds what the refused compile built)
    again = late.compile(kind, spec)
    fresh = ConstraintCompiler(lambda: vocab).compile(kind, spec)
    assert np.array_equal(again.allowed(again.initial()), fresh.allowed(fresh.initial()))


def test_no_deadline_outside_a_compile():
    deadline.check()  # nothing installed: never raises
    with deadline.limit(None):
        deadline.check()


def test_an_engine_refuses_a_request_whose_constraint_misses_the_deadline(tiny_engine_factory):
    engine = tiny_engine_factory(constraint_compile_timeout=1e-9)
    with pytest.raises(ValueError, match="constraint_compile_timeout"):
        engine.generate("hi", {"json_schema": SCHEMA, "max_new_tokens": 4})
    assert engine.generate("hi", {"max_new_tokens": 2, "temperature": 0}).text is not None  # still serving
