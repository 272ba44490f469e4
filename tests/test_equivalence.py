"""One equivalence for `diff` and `migrate`: meaning, not spelling, and both tools agree on every pair."""
from __future__ import annotations

import os
import re
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import blockir
from blockir.analyses import equivalence as E
from blockir.analyses.diff import BlockDiff, diff_blocks
from blockir.analyses.keys import param_keys
from blockir.analyses.migration import FunctionCheck, check_function
from blockir.cli import with_callees
from blockir import ops as O
from blockir.ir.kinds import ACTIVATIONS, GATES, KINDS
from blockir.ir.program import Block, Program
from conftest import EXAMPLES, ROOT

LLAMA = (ROOT / "examples" / "llama.block").read_text()
TEXTS = {p.stem: p.read_text() for p in EXAMPLES}
NAME = r"[A-Za-z_][A-Za-z0-9_]*"


def _load(text: str, filename: str = "<edit>") -> Program:
    program = blockir.parse(text, filename)
    assert not [d for d in blockir.verify(program) if d.is_error], filename
    return program


def _target(program: Program) -> Block:
    models = [b for b in program.blocks if b.kind == "model"]
    return models[-1] if models else program.blocks[-1]


def _both(a: str, b: str) -> tuple[BlockDiff, FunctionCheck]:
    """What `blockir diff` and the migration's function check say about the default blocks of two texts."""
    pa, pb = _load(a, "a.block"), _load(b, "b.block")
    x, y = _target(pa), _target(pb)
    source = {k.name for k in param_keys(pa, x.name).keys}
    new = tuple(k for k in param_keys(pb, y.name).keys if k.name not in source)
    return diff_blocks(pa, x, pb, y), check_function(pa, x, pb, y, new)


def _agree(d: BlockDiff, f: FunctionCheck) -> str:
    assert d.same_function == (f.verdict == "same"), (d.verdict, f.verdict, f.reason)
    return d.category


def test_a_constant_and_its_value_are_one_function() -> None:
    a = LLAMA.replace("dim H: heads = 4\n", "dim H: heads = 4\nconst NH = 4\n").replace("heads=H,", "heads=NH,")
    b = LLAMA.replace("heads=H,", "heads=4,").replace("kv_heads=2", "kv_heads=4 - 2")
    d, f = _both(a, b)
    assert (_agree(d, f), d.verdict, f.verdict) == (E.IDENTICAL, "identical", "same")


def test_a_pure_rename_is_the_same_function_in_both_tools() -> None:
    d, f = _both(LLAMA, LLAMA.replace("input_layernorm", "attn_norm"))
    assert (_agree(d, f), d.verdict, f.verdict) == (E.RENAMED, "same function, renamed parameter keys (same shapes)",
                                                    "same")
    assert d.key_changes == ("-layers.0.input_layernorm.weight [64]", "-layers.1.input_layernorm.weight [64]",
                             "+layers.0.attn_norm.weight [64]", "+layers.1.attn_norm.weight [64]")


def test_a_model_whose_stacked_layer_changed_is_a_different_function() -> None:
    changed = LLAMA.replace("rope_theta=10000", "rope_theta=500000")
    d, f = _both(LLAMA, changed)
    assert (_agree(d, f), d.verdict, f.verdict) == (
        E.DIFFERENT, "same parameter keys and shapes, different function", "changes")
    # the difference is shown where it is: in the layer, not at the model's call of the stack
    assert (d.where_a.name, d.where_b.name) == ("LlamaDecoderLayer", "LlamaDecoderLayer")
    assert d.first_a.text() == d.first_b.text() == "%1 = self_attn(%0)"
    assert f.first_source == (d.first_a.span, "%1 = self_attn(%0)")


def test_a_renamed_layer_block_and_its_stack_count_spelled_as_a_constant_are_identical() -> None:
    b = LLAMA.replace("LlamaDecoderLayer", "Layer").replace("Layer * 2", "Layer * N").replace(
        "dim B: batch\n", "dim B: batch\nconst N = 1 + 1\n")
    d, f = _both(LLAMA, b)
    assert (_agree(d, f), d.verdict) == (E.IDENTICAL, "identical")
    d, f = _both(LLAMA, b.replace("Layer * N", "Layer * 3"))
    assert (_agree(d, f), d.verdict) == (E.DIFFERENT, "different function and different parameter keys")


def test_a_tied_norm_is_not_two_equal_norms() -> None:
    both = LLAMA.replace("input_layernorm: rmsnorm(D, eps=1e-6, offset=0, cast=before_weight, accum=f32)",
                         "input_layernorm: rmsnorm(D, eps=1e-6, offset=0, cast=before_weight, accum=f32, tied=true)")
    tied = both.replace("mlp(post_attention_layernorm(h))", "mlp(input_layernorm(h))")
    d, f = _both(both, tied)
    assert _agree(d, f) == E.DIFFERENT


def test_a_renamed_dropout_draws_another_mask_so_it_is_another_function() -> None:
    text = TEXTS["encoder_decoder"]
    named = text.replace("h = x + dropout(self_attn(norm_1(x)), p=0.1)", "u = dropout(self_attn(norm_1(x)), p=0.1)\n"
                         "  h = x + u")
    d, f = _both(named, named.replace("u = dropout", "v = dropout").replace("h = x + u", "h = x + v"))
    assert _agree(d, f) == E.DIFFERENT
    d, f = _both(named, named.replace("h = x + u", "g = x + u").replace("(norm_2(h)", "(norm_2(g)")
                 .replace("c = h +", "c = g +").replace("y = h +", "y = g +"))
    assert _agree(d, f) == E.IDENTICAL


# --- random edits of the examples ---------------------------------------------------------------------

def _blocks(text: str) -> list[tuple[int, int]]:
    """(first, last) line index of each block body."""
    lines = text.split("\n")
    out, start = [], None
    for i, line in enumerate(lines):
        if re.match(rf"(block|model) {NAME}\(", line):
            start = i + 1
        elif line.startswith("}") and start is not None:
            out.append((start, i))
            start = None
    return out


def _replace_in_body(text: str, span: tuple[int, int], old: str, new: str) -> str:
    lines = text.split("\n")
    body = "\n".join(lines[span[0] - 1: span[1]])  # the header line too: it names the parameters
    body = re.sub(rf"(?<![\w.%]){re.escape(old)}(?![\w])", new, body)
    return "\n".join(lines[: span[0] - 1] + body.split("\n") + lines[span[1]:])


def _keys(program: Program) -> tuple:
    table = param_keys(program, _target(program).name)
    return table.shapes, table.unknown


def _edit(text: str, kind: str, pick: st.DataObject) -> tuple[str, str] | None:
    """An edited text and the category it must get against the original, or None where the file offers
    no place for this edit."""
    program = _load(text)
    reached = {b.name for b in with_callees(program, _target(program))}
    lines = text.split("\n")
    spans = [s for s in _blocks(text) if lines[s[0] - 1].split()[1].split("(")[0] in reached]
    span = pick.draw(st.sampled_from(spans))
    block = program.block(lines[span[0] - 1].split()[1].split("(")[0])
    # a name also spelled as a kind, a function, a dim or a constant cannot be renamed by its text
    reserved = {*KINDS, *ACTIVATIONS, *GATES, *(d.name for d in program.dims), *(c.name for c in program.consts),
                *(c.name for b in program.blocks for c in b.consts)}
    fresh = "renamed_" + pick.draw(st.sampled_from(["a", "b", "c"]))
    if kind == "rename value":
        values = [op.result for op in block.ops if not isinstance(op, O.OutputOp) and not op.result.startswith("%")
                  and op.result not in block.decl_map and op.result not in reserved]
        if not values:
            return None
        value = pick.draw(st.sampled_from(values))
        draws = type(block.producers[value]) is O.DropoutOp  # its name keys its mask
        return _replace_in_body(text, span, value, fresh), E.DIFFERENT if draws else E.IDENTICAL
    if kind == "rename declaration":
        if not block.decls:
            return None
        decl = pick.draw(st.sampled_from([d.name for d in block.decls if "." not in d.name and d.name not in reserved] or [None]))
        if decl is None:
            return None
        changed = _replace_in_body(text, span, decl, fresh)
        return changed, E.RENAMED if _keys(_load(changed)) != _keys(program) else E.IDENTICAL
    if kind == "literal to constant":
        found = [(i, m) for i in range(span[0], span[1]) if re.match(rf"\s+{NAME}(\.{NAME})*: ", lines[i])
                 for m in re.finditer(r"(?<=[=(, ])(\d+(\.\d+)?(e-?\d+)?)(?=[,)]|$)", lines[i])]
        if not found:
            return None
        i, m = pick.draw(st.sampled_from(found))
        lines[i] = lines[i][: m.start()] + "LITERAL_K" + lines[i][m.end():]
        return "const LITERAL_K = " + m.group(1) + "\n" + "\n".join(lines), E.IDENTICAL
    if kind == "reorder declarations":
        decls = [i for i in range(span[0], span[1] - 1) if re.match(rf"\s+{NAME}(\.{NAME})*: ", lines[i])
                 and re.match(rf"\s+{NAME}(\.{NAME})*: ", lines[i + 1])]
        if not decls:
            return None
        i = pick.draw(st.sampled_from(decls))
        lines[i], lines[i + 1] = lines[i + 1], lines[i]
        return "\n".join(lines), E.IDENTICAL
    if kind in ("change eps", "change stacked layer"):
        stacked = {d.block for b in program.blocks for d in b.decls if getattr(d, "count", None) is not None}
        where = [i for s in spans for i in range(*s) if re.search(r"\beps=", lines[i])
                 and (kind == "change eps" or lines[s[0] - 1].split()[1].split("(")[0] in stacked)]
        if not where:
            return None
        i = pick.draw(st.sampled_from(where))
        lines[i] = re.sub(r"\beps=[^,)]+", "eps=0.125", lines[i], count=1)
        changed = "\n".join(lines)
        return (changed, E.DIFFERENT) if changed != text else None
    raise AssertionError(kind)


EDITS = ("rename value", "rename declaration", "literal to constant", "reorder declarations", "change eps",
         "change stacked layer")
RUNS = int(os.environ.get("BLOCKIR_PROPERTY_EXAMPLES", 12))


@settings(max_examples=RUNS, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(name=st.sampled_from(sorted(TEXTS)), kind=st.sampled_from(EDITS), pick=st.data())
def test_diff_and_migrate_agree_on_random_edits_of_the_examples(name: str, kind: str, pick: st.DataObject) -> None:
    text = TEXTS[name]
    edited = _edit(text, kind, pick)
    if edited is None:
        return
    changed, expected = edited
    d, f = _both(text, changed)
    assert _agree(d, f) == expected, (name, kind, d.verdict)
