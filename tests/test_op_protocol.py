"""Every op kind fills its protocol: it states its traits and registers each hook table it must.

A stage reads a kind's behaviour from a table the kind's own file fills (``blockir/ops/<kind>.py``),
so a kind that forgets a registration would fail only when some program first reaches that stage.
These tests make the omission visible at once, and hold the number of files that name each op
class to what it is (the goal is at most five: its own file, ``ops/__init__.py`` and a few users).
"""
from __future__ import annotations

import importlib
import pkgutil
import re
from dataclasses import fields
from functools import lru_cache

import pytest

import blockir
import blockir.ops as ops
from blockir.analyses.equivalence import Interner, _Builder, _identity
from blockir.ir.hooks import BUILD, EQUIVALENCE, KEYS, LAYOUT
from blockir.ir.op import OpBase
from blockir.ir.traits import AddNorm, Trait
from blockir.passes.fuse import fuse_block
from conftest import ROOT

KINDS = [getattr(ops, name) for name in ops.__all__ if name != "Op"]
PACKAGE = ROOT / "blockir"

# a block writing every construct of the language once
EVERY_CONSTRUCT = """
dim B: batch
dim S: seq
dim D: model = 8
dim F: hidden = 2 * D
dim H: heads = 2

block Every(x: [B, S, D], m: [B, S, D]) -> [B, S, D] {
  norm: rmsnorm(D, accum=f32)
  up: linear(D, F)
  down: linear(F, D)
  shift: bias(init=0.0)
  gain: scalar(init=1.0)
  add_norm: extern(u: [B, S, D], r: [B, S, D]; norm=rmsnorm(D), residual=1) -> ([B, S, D], [B, S, D])
  a = norm(x)
  b = down(gelu(up(a)))
  c = dropout(b, p=0.1) + drop_path(m, p=0.1)
  d = layer_drop(gain * c, p=0.1) + shift
  z = sigmoid(d)
  e = z * d + (1 - z) * (2 * d)
  f = cast(softcap(e - x, cap=30), f32)
  g = concat(f, a)
  s0 = zeros([B, S, D])
  n, h0 = add_norm(f, x)
  h = h0 + n
  y = norm(h)
  return y
}
"""


def _kinds_defined_in_the_package() -> set[type]:
    found: set[type] = set()
    for info in pkgutil.iter_modules(ops.__path__):
        module = importlib.import_module(f"blockir.ops.{info.name}")
        found |= {c for c in vars(module).values() if isinstance(c, type) and issubclass(c, OpBase)
                  and c.__module__ == module.__name__ and c.TRAITS}
    return found


def test_every_kind_the_package_defines_is_exported_and_states_its_traits() -> None:
    assert _kinds_defined_in_the_package() == set(KINDS)
    for kind in KINDS:
        assert kind.TRAITS, kind.__name__
        assert all(isinstance(t, type) and issubclass(t, Trait) and t is not Trait for t in kind.TRAITS)


def test_every_kind_fills_the_analysis_tables() -> None:
    assert LAYOUT.missing(KINDS) == []
    assert EQUIVALENCE.missing(KINDS) == []
    # a kind applying a declaration says which type the declaration's row has
    applying = [k for k in KINDS if any(f.metadata.get("role") == "decl" for f in fields(k))]
    assert {k.__name__ for k in applying} == {"NormOp", "CallOp", "ScaleOp", "BiasOp", "FusedAddNormOp",
                                              "ExternAddNormOp"}
    assert KEYS.missing(applying) == []


def test_every_written_kind_is_built_by_its_own_file() -> None:
    built = set(BUILD.constructs().values())
    # a fused add+norm is made by the fusion pass, never written; an extern add+norm is written as a call
    assert set(KINDS) - built == {k for k in KINDS if AddNorm in k.TRAITS} - {ops.ExternAddNormOp}
    for construct, kind in BUILD.constructs().items():
        assert BUILD.of(construct).__module__ == kind.__module__, construct


def test_a_block_of_every_construct_holds_every_kind() -> None:
    program = blockir.parse(EVERY_CONSTRUCT)
    block, chains = fuse_block(program.block("Every"))
    assert chains, "the residual add a norm reads is fused"
    assert {type(op) for op in program.block("Every").ops} | {type(op) for op in block.ops} == set(KINDS)


def test_each_kind_labels_itself_for_equivalence() -> None:
    """Two ops of different kinds never share a label's kind, whatever their fields; a dropout's own name
    keys its mask and a layer drop's does not (one draw per layer)."""
    program = blockir.parse(EVERY_CONSTRUCT)
    fused, _ = fuse_block(program.block("Every"))
    labels: dict[type, set[object]] = {}
    for block in (program.block("Every"), fused):
        builder = _Builder(Interner(named=False), program, block, _identity)
        for op in block.ops:
            labels.setdefault(type(op), set()).add(EQUIVALENCE.of(op)(op, builder)[0])
    tags = [tag for kind_tags in labels.values() for tag in kind_tags]
    assert len(tags) == len(set(tags)) == len(KINDS)
    by_name = {op.result: op for op in program.block("Every").ops}
    builder = _Builder(Interner(named=False), program, program.block("Every"), _identity)
    drop = next(op for op in by_name.values() if op.label() == "'dropout(…)'")
    layer = next(op for op in by_name.values() if op.label() == "'layer_drop(…)'")
    assert EQUIVALENCE.of(drop)(drop, builder)[2] == drop.result
    assert EQUIVALENCE.of(layer)(layer, builder)[2] is None


@lru_cache(maxsize=None)
def _sources() -> dict[str, str]:
    return {str(p.relative_to(ROOT)): p.read_text() for p in sorted(PACKAGE.rglob("*.py"))}


def _files_naming(name: str, under: str = "blockir/") -> list[str]:
    word = re.compile(rf"\b{name}\b")
    return [path for path, text in _sources().items() if path.startswith(under) and word.search(text)]


# An op class is named by its own file, the package that exports it, and at most three constructors
# (the one a kind is built in, the module of passes that builds rewritten ops): everything else asks traits.
MAX_FILES_NAMING = 5
OP_CLASSES = [k.__name__ for k in KINDS]


@pytest.mark.parametrize("name", sorted(OP_CLASSES))
def test_few_files_name_an_op_class(name: str) -> None:
    assert len(_files_naming(name)) <= MAX_FILES_NAMING, _files_naming(name)


@pytest.mark.parametrize("where", ["blockir/ir/", "blockir/frontend/", "blockir/analyses/", "blockir/verifiers/",
                                   "blockir/lower/", "blockir/reports/", "blockir/lift/", "blockir/importers/",
                                   "blockir/commands/"])
def test_only_ops_and_the_pass_builders_name_op_classes(where: str) -> None:
    naming = {name: _files_naming(name, where) for name in OP_CLASSES}
    assert {name: files for name, files in naming.items() if files} == {}
