"""One size environment: every consumer (keys, both backends, inlining, cost) reads the same validated sizes."""
from __future__ import annotations

import pytest

import blockir
from blockir.analyses.keys import param_keys
from blockir.reports.cost import ledger

STACK = """dim B: batch
dim S: seq
dim D: model = 8
const N = 2

block L(x: [B, S, D]) -> [B, S, D] {
  n: rmsnorm(D)
  f: mlp(D)
  h = x + f(n(x))
  return h
}

model M(x: [B, S, D]) -> [B, S, D] {
  layers: L * N
  norm: rmsnorm(D)
  return norm(layers(x))
}
"""


def _program() -> blockir.ir.Program:
    return blockir.parse(STACK, "stack.block")


@pytest.mark.parametrize("backend", ["fx", "fused"])
def test_an_overridden_constant_sets_the_depth_of_every_backend(backend: str) -> None:
    m = blockir.compile(_program(), "M", backend=backend, dims={"N": 3})
    assert {k.split(".")[1] for k in m.state_dict() if k.startswith("layers.")} == {"0", "1", "2"}


def test_keys_and_cost_read_the_same_override() -> None:
    keys = param_keys(_program(), "M", {"N": 3}).shapes
    assert "layers.2.n.weight" in keys and "layers.3.n.weight" not in keys
    assert {b.name: b.instances for b in ledger(_program(), "M", {"N": 3, "B": 2, "S": 4}).blocks}["L"] == 3


def _e0702(dims: object) -> blockir.Diagnostic:
    with pytest.raises(blockir.BlockError) as info:
        blockir.compile(_program(), "M", dims=dims)  # type: ignore[arg-type]
    (d,) = info.value.diagnostics
    assert d.code == "E0702"
    return d


@pytest.mark.parametrize("value, shown", [(0, "0"), (-4, "-4"), (2**62, str(2**62))])
def test_a_size_must_be_a_positive_integer_in_range(value: int, shown: str) -> None:
    d = _e0702({"D": value})
    assert d.message == f"size of 'D' must be a positive integer up to 2147483647, got {shown}"
    assert (d.span.line, d.span.column) == (3, 5)  # the dim's declaration
    assert d.hint == "dims: B, S, D"


@pytest.mark.parametrize("value", [2.5, True, "8", None])
def test_a_size_is_never_coerced(value: object) -> None:
    assert _e0702({"D": value}).message == f"size of 'D' must be a positive integer, got {value!r}"


def test_per_layer_names_are_not_overrides() -> None:
    d = _e0702({"num_layers": 4})
    assert d.message == "unknown dim(s) in dims=: num_layers"
    assert d.hint == ("dims: B, S, D; 'num_layers' is bound by each stack for its own layers: "
                      "change the stack's count instead")


def test_a_declared_size_out_of_range_is_refused_before_allocating() -> None:
    program = blockir.parse(STACK.replace("dim D: model = 8", "dim D: model = 2 ** 62"), "huge.block")
    with pytest.raises(blockir.BlockError) as info:
        blockir.compile(program, "M")
    (d,) = info.value.diagnostics
    assert (d.code, d.message, d.span.line) == ("E0702", f"dim 'D' must be a positive integer up to 2147483647, "
                                                f"got {2**62}", 3)
