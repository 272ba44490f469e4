"""Parameter keys and shapes a block owns, and reconciliation against a checkpoint.

Keys follow the declarations: a norm owns its family's state (LayerNorm
``weight`` and ``bias``, RMSNorm ``weight``, ScaleNorm ``scale``, DyT ``alpha``,
``weight`` and ``bias``), the built-in branches own the projections of the
models they mirror (``q_proj`` … ``o_proj``, ``fc1``/``fc2``,
``gate_proj``/``up_proj``/``down_proj``), a learned scale is its own key, a
stack prefixes each layer with ``name.i.``. An extern is bound from Python, so
its keys are unknown and reported as such. Each key carries its role (parameter,
buffer, counter), its layout and, for a tied head, the key whose tensor it shares
(blockir/analyses/key_roles.py).

Reconciliation never loads anything: it reports every missing, unexpected and
mis-shaped key (a single number stored 0-d or as ``[1]`` fits either way) and explains family mismatches (a LayerNorm bias offered to an
RMSNorm), because a partial load silently changes the model. A tied table is complete under either of its
names, as the compiled module loads it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import networkx as nx

from blockir.analyses.key_roles import KeyRole, key_role
from blockir.norms import FAMILIES, family
from blockir.analyses.sizes import Sizes, reads_layer
from blockir.analyses.summaries import call_graph, callees_first
from blockir.diagnostics import BlockError, Span, argument_error, error
from blockir.ir.decls import ExternDecl, InstanceDecl, KindDecl
from blockir.ir.kinds import layer_names
from blockir.ir.hooks import KEYS
from blockir.ops import Op
from blockir.ir.program import Block, Program
from blockir.signatures import public

Shape = tuple[int, ...]


@dataclass(frozen=True)
class Key:
    name: str
    shape: Shape
    owner: str  # the declaration path that owns it (with stack prefixes)
    family: str  # the owner's kind: layernorm, rmsnorm, self_attention, linear, scalar, …
    block: str = ""  # the block whose declaration owns it
    decl: str = ""  # that declaration's name inside the block
    role: str = "parameter"  # parameter | buffer | counter (blockir/analyses/key_roles.py)
    layout: str = ""  # out,in | in,out | expert,out,in | rows | channel | scalar
    fused: str | None = None  # the row order of a fused projection: q;k;v, gate;up, …
    alias_of: str | None = None  # the key whose tensor this name shares (a tied head)


@dataclass(frozen=True)
class KeyTable:
    block: str
    keys: tuple[Key, ...]
    unknown: tuple[str, ...]  # prefixes of externs, whose keys are bound from Python

    @property
    def shapes(self) -> dict[str, Shape]:
        return {k.name: k.shape for k in self.keys}

    @property
    def aliases(self) -> dict[str, str]:
        """Second name -> the key whose tensor it shares."""
        return {k.name: k.alias_of for k in self.keys if k.alias_of is not None}

    def __str__(self) -> str:
        width = max((len(k.name) for k in self.keys), default=0)
        shapes = [f"[{', '.join(map(str, k.shape))}]" for k in self.keys]
        wide = max((len(t) for t in shapes), default=0)
        lines = [f"{k.name:<{width}}  {t:<{wide}}  {_facts(k)}".rstrip() for k, t in zip(self.keys, shapes)]
        lines += [f"{p}.*  (extern: keys bound from Python, unknown here)" for p in self.unknown]
        return "\n".join(lines)


def _facts(k: Key) -> str:
    """The text columns of a key: its role and layout, its fused row order, the key it aliases."""
    extra = ([f"rows {k.fused}"] if k.fused else []) + ([f"= {k.alias_of} (tied: one tensor)"] if k.alias_of else [])
    return "  ".join([f"{k.role:<9}  {k.layout:<7}", *extra])


def _first_use(block: Block, decl: str) -> Op | None:
    return next((op for op in block.ops if decl in op.applied), None)


def _width(block: Block, op: Op | None, arg: int, s: Sizes) -> int:
    """The width of argument ``arg`` of the op applying a declaration (its kind's ``KEYS`` hook says which
    type that is), else the block's result width."""
    t = (KEYS.of(op)(op, block, arg) if op is not None else None) or block.result
    if t.last is None:
        raise BlockError([error("E0701", f"'{block.name}' has no model axis to size its branches", block.span)])
    return s.axis(t.last)


def _linear(prefix: str, out: int, inp: int, bias: bool, conv1d: bool = False) -> list[tuple[str, Shape]]:
    """A projection's keys; GPT-2's Conv1D stores the weight transposed, ``[in, out]``."""
    dot = f"{prefix}." if prefix else ""
    return [(f"{dot}weight", (inp, out) if conv1d else (out, inp))] + ([(f"{dot}bias", (out,))] if bias else [])


def _norm(decl: KindDecl, s: Sizes) -> list[tuple[str, Shape]]:
    shape = tuple(s.dim(a) for a in decl.arg("axes"))
    return family(decl).keys(decl, shape) + family(decl).buffers(decl, shape)


def _attention(block: Block, decl: KindDecl, s: Sizes) -> list[tuple[str, Shape]]:
    use = _first_use(block, decl.name)
    width = _width(block, use, 0, s)
    kv_width = _width(block, use, 1, s) if decl.kind == "cross_attention" else width
    heads = s.count(decl.arg("heads"), f"heads of '{decl.name}'", decl.span)
    kv = s.count(decl.arg("kv_heads"), f"kv_heads of '{decl.name}'", decl.span) \
        if decl.arg("kv_heads") is not None else heads
    if decl.arg("head_dim") is not None:
        hd = s.count(decl.arg("head_dim"), f"head_dim of '{decl.name}'", decl.span)
    elif width % heads:
        raise BlockError([error("E0701", f"{heads} heads of '{decl.name}' in '{block.name}' do not divide its width "
                                f"{width}", decl.span, hint="give head_dim=…, or a number of heads that divides the width")])
    else:
        hd = width // heads
    bias, out_bias, conv1d = bool(decl.arg("bias")), bool(decl.arg("out_bias")), bool(decl.arg("conv1d"))
    names = layer_names(decl.kind, dict(decl.args))
    if decl.arg("fused") == "none":
        keys = (_linear(names["q"], heads * hd, width, bias, conv1d) + _linear(names["k"], kv * hd, kv_width, bias, conv1d)
                + _linear(names["v"], kv * hd, kv_width, bias, conv1d))
    else:
        keys = _linear(names["qkv"], (heads + 2 * kv) * hd, width, bias, conv1d)
    keys += _linear(names["o"], width, heads * hd, out_bias, conv1d)
    if decl.arg("qk_norm") in FAMILIES:  # the q/k norm's own keys, at its defaults (an l2norm learns nothing)
        qk = FAMILIES[decl.arg("qk_norm")]
        for role, count in (("q_norm", heads), ("k_norm", kv)):
            n = hd if decl.arg("qk_norm_axis") == "head" else count * hd
            keys += [(f"{names[role]}.{key}", shape) for key, shape in qk.keys(qk.defaults(), (n,))]
    if decl.arg("qk_scale"):
        keys.append(("qk_scale", (heads * hd,)))
    if decl.arg("head_scale"):
        keys.append(("head_scale", (heads,)))
    return keys + _fixup_biases(decl)


def fixup_biases(decl: KindDecl) -> tuple[str, ...]:
    """The keys of Fixup's scalar biases inside a branch declared with ``fixup_bias=true``: before an MLP's
    activation and its output layer; before attention's output projection (its value mixing is linear)."""
    if not decl.arg("fixup_bias"):
        return ()
    return ("fixup_bias_out",) if decl.kind.endswith("attention") else ("fixup_bias_act", "fixup_bias_out")


def _fixup_biases(decl: KindDecl) -> list[tuple[str, Shape]]:
    return [(n, ()) for n in fixup_biases(decl)]


def _moe(block: Block, decl: KindDecl, s: Sizes) -> list[tuple[str, Shape]]:
    width = _width(block, _first_use(block, decl.name), 0, s)
    hidden = s.dim(decl.arg("hidden"))
    experts = s.count(decl.arg("experts"), f"experts of '{decl.name}'", decl.span)
    names = layer_names(decl.kind, dict(decl.args))
    keys = _linear(names["router"], experts, width, False) + [
        (f"{names['experts_name']}.gate_up_proj", (experts, 2 * hidden, width)),
        (f"{names['experts_name']}.down_proj", (experts, width, hidden))]
    if decl.arg("shared") is not None:
        shared = s.dim(decl.arg("shared"))
        keys += [(f"{names['shared_expert']}.{k}", shape) for k, shape in (
            _linear("gate_proj", shared, width, False) + _linear("up_proj", shared, width, False)
            + _linear("down_proj", width, shared, False))]
        if decl.arg("shared_gate"):
            keys += _linear(names["shared_expert_gate"], 1, width, False)
    return keys


def _kind_keys(block: Block, decl: KindDecl, s: Sizes) -> list[tuple[str, Shape]]:
    if decl.category == "norm":
        return _norm(decl, s)
    if decl.kind in ("self_attention", "cross_attention"):
        return _attention(block, decl, s)
    if decl.kind in ("mlp", "gated_mlp"):
        width = _width(block, _first_use(block, decl.name), 0, s)
        hidden, bias = s.dim(decl.arg("hidden")), bool(decl.arg("bias"))
        names = layer_names(decl.kind, dict(decl.args))
        if decl.kind == "mlp":
            conv1d = bool(decl.arg("conv1d"))
            return _linear(names["fc1"], hidden, width, bias, conv1d) + \
                _linear(names["fc2"], width, hidden, bias, conv1d) + _fixup_biases(decl)
        gate_up = _linear(names["gate_up"], 2 * hidden, width, bias) if decl.arg("fused") else \
            _linear(names["gate"], hidden, width, bias) + _linear(names["up"], hidden, width, bias)
        return gate_up + _linear(names["down"], width, hidden, bias) + _fixup_biases(decl)
    if decl.kind == "moe":
        return _moe(block, decl, s)
    if decl.kind == "linear":
        return _linear("", s.dim(decl.arg("out_dim")), s.dim(decl.arg("in_dim")), bool(decl.arg("bias")))
    if decl.kind == "embedding":
        return [("weight", (s.dim(decl.arg("vocab")), s.dim(decl.arg("width"))))]
    if decl.kind == "head":
        width = _width(block, _first_use(block, decl.name), 0, s)
        return _linear("", s.dim(decl.arg("vocab")), width, bool(decl.arg("bias")))
    if decl.kind == "scalar":
        return [("", ())]
    if decl.kind in ("vector", "bias"):
        return [("", (s.dim(decl.arg("axis")),) if decl.arg("axis") is not None else ())]
    return []  # activations own no state


def decl_keys(block: Block, decl: KindDecl, sizes: Sizes) -> list[str]:
    """The state_dict keys ``decl`` of ``block`` owns, relative to the declaration's own path."""
    return [name for name, _ in _kind_keys(block, decl, sizes)]


def _collect(program: Program, block: Block, s: Sizes, prefix: str, keys: list[Key], unknown: list[str],
             nested: bool = True) -> None:
    """Every key under ``block``, in declaration order, through sub-blocks and stacks unless not ``nested`` (an
    explicit work list: nesting depth is bounded by memory, not by Python's stack)."""
    work: list[tuple[Block, Sizes, str, int]] = [(block, s, prefix, 0)]
    roles: dict[tuple[str, str, str, Shape], KeyRole] = {}  # a stack's layers repeat their declarations' roles
    while work:
        current, scope, path_prefix, start = work.pop()
        for index in range(start, len(current.decls)):
            decl = current.decls[index]
            path = path_prefix + decl.name
            if isinstance(decl, ExternDecl):
                unknown.append(path)
            elif isinstance(decl, KindDecl):
                for name, shape in _kind_keys(current, decl, scope):
                    memo = (current.name, decl.name, name, shape)
                    r = roles.get(memo)
                    if r is None:
                        r = roles[memo] = key_role(current, decl, name, shape, path_prefix, current is block)
                    keys.append(Key(f"{path}.{name}" if name else path, shape, path, decl.kind, current.name,
                                    decl.name, r.role, r.layout, r.fused, r.alias_of))
            elif nested and isinstance(decl, InstanceDecl) and decl.block in program.block_map:
                inner = program.block(decl.block)
                work.append((current, scope, path_prefix, index + 1))  # the rest of this block, afterwards
                if decl.count is None:
                    work.append((inner, scope.for_block(inner), path + ".", 0))
                else:
                    n = scope.count(decl.count, f"the layer count of '{decl.name}'", decl.span)
                    work += [(inner, scope.for_block(inner, i, n), f"{path}.{i}.", 0) for i in reversed(range(n))]
                break


Layout = tuple


def key_layout(program: Program, name: str, dims: Mapping[str, int] | None = None) -> Layout:
    """A value whose equality implies equal key tables, computed in time independent of stack depth.

    A stack of a block that does not read its layer index is one entry (its count and its layer's
    layout) instead of a key list per layer; a layer that reads its index is laid out per layer. Each
    distinct block layout is numbered and referred to by number, so the value stays flat however
    deeply blocks nest.
    """
    base = Sizes.of(program, dims)
    memo: dict[tuple[str, int, int], int] = {}
    numbered: dict[tuple, int] = {}

    def layout(block: Block, layer: int, n: int) -> int:
        key = (block.name, layer if reads_layer(block) else 0, n)
        if key not in memo:
            scope = base.for_block(block, layer, n)
            entries: list[tuple] = []
            for d in block.decls:
                if isinstance(d, ExternDecl):
                    entries.append((d.name, "extern"))
                elif isinstance(d, KindDecl):
                    entries.append((d.name, d.kind, tuple(_kind_keys(block, d, scope))))
                elif isinstance(d, InstanceDecl) and d.block in program.block_map:
                    inner = program.block(d.block)
                    if d.count is None:
                        entries.append((d.name, "block", layout(inner, 0, 1)))
                        continue
                    count = scope.count(d.count, f"the layer count of '{d.name}'", d.span)
                    layers = (layout(inner, 0, count),) if not reads_layer(inner) else \
                        tuple(layout(inner, i, count) for i in range(count))
                    entries.append((d.name, "stack", count, layers))
            memo[key] = numbered.setdefault(tuple(entries), len(numbered))
        return memo[key]

    reachable = nx.descendants(call_graph(program), name) | {name}
    for block_name in callees_first(program):  # callees first: nested layouts are numbered before use
        if block_name in reachable:
            layout(program.block(block_name), 0, 1)
    return tuple(numbered), memo[(name, 0, 1)]


def param_keys(program: Program, name: str, dims: Mapping[str, int] | None = None) -> KeyTable:
    """The parameter keys and shapes block (or model) ``name`` owns; ``dims`` sizes open dims."""
    if name not in program.block_map:
        raise BlockError([error("E0700", f"no block named '{name}' (blocks: {', '.join(program.block_map) or 'none'})",
                                Span(program.filename, 1, 1))])
    return key_table(program, program.block(name), Sizes.of(program, dims))


def key_table(program: Program, block: Block, sizes: Sizes, nested: bool = True) -> KeyTable:
    """``param_keys`` of ``block`` under program-level ``sizes`` the caller already holds; without ``nested``
    only the keys of the block's own declarations (not of the blocks and stacks it instantiates)."""
    keys: list[Key] = []
    unknown: list[str] = []
    _collect(program, block, sizes.for_block(block), "", keys, unknown, nested)
    return KeyTable(block.name, tuple(keys), tuple(unknown))


# --- reconciliation ----------------------------------------------------------------

@dataclass(frozen=True)
class FamilyMismatch:
    owner: str
    family: str
    message: str


@dataclass(frozen=True)
class Reconciliation:
    block: str
    missing: tuple[str, ...]
    unexpected: tuple[str, ...]
    misshaped: tuple[tuple[str, Shape, Shape], ...]  # key, expected, given
    family: tuple[FamilyMismatch, ...]
    unchecked: tuple[str, ...] = field(default=())  # keys under externs, bound from Python

    @property
    def ok(self) -> bool:
        return not (self.missing or self.unexpected or self.misshaped or self.family)

    def __str__(self) -> str:
        if self.ok:
            extra = f" ({len(self.unchecked)} keys under externs not checked)" if self.unchecked else ""
            return f"'{self.block}': every key and shape matches{extra}"
        lines = [f"'{self.block}' does not match the checkpoint:"]
        lines += [f"  family mismatch: {f.message}" for f in self.family]
        lines += [f"  missing: {k}" for k in self.missing]
        lines += [f"  unexpected: {k}" for k in self.unexpected]
        lines += [f"  mis-shaped: {k}: expected [{', '.join(map(str, e))}], got [{', '.join(map(str, g))}]"
                  for k, e, g in self.misshaped]
        if self.unchecked:
            lines.append(f"  ({len(self.unchecked)} keys under externs not checked)")
        return "\n".join(lines)


SINGLE: frozenset[Shape] = frozenset({(), (1,)})


def fits(expected: Shape, given: Shape) -> bool:
    """Whether a checkpoint tensor of shape ``given`` loads into a parameter of shape ``expected``:
    equal shapes, or one number stored 0-d or as ``[1]`` (the compiled module reshapes it on load)."""
    return given == expected or (given in SINGLE and expected in SINGLE)


def _bad(argument: str, message: str, hint: str | None = None) -> BlockError:
    return BlockError([argument_error("reconcile", argument, message, hint)])


def _shape(key: Any, v: Any) -> Shape:
    """A tensor's shape, or a shape given as a sequence of non-negative ints."""
    dims = v.shape if hasattr(v, "shape") else v
    if isinstance(dims, (str, bytes)) or not isinstance(dims, Sequence) or \
            not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in dims):
        raise _bad("state_dict_or_shapes", f"key {key!r} maps to {type(v).__name__} {v!r:.60}, neither a tensor nor "
                   "a shape", "give a state_dict (key -> tensor) or key -> shape, e.g. {'norm.weight': (64,)}")
    return tuple(int(n) for n in dims)


def _checked_arguments(program: Any, name: Any, given: Any) -> None:
    if not isinstance(program, Program):
        raise _bad("program", f"reconcile expects a Program, got {type(program).__name__}",
                   "blockir.load(path) or blockir.parse(text)")
    if not isinstance(name, str) or name not in program.block_map:
        raise BlockError([error("E0700", f"no block named {name!r} (blocks: {', '.join(program.block_map)})",
                                Span(program.filename, 1, 1))])
    if not isinstance(given, Mapping):
        raise _bad("state_dict_or_shapes", f"expected a mapping of keys to tensors or shapes, got "
                   f"{type(given).__name__}", "pass module.state_dict(), or {key: shape}")


def _families(table: KeyTable, missing: set[str], unexpected: set[str]) -> list[FamilyMismatch]:
    owners = {k.owner: k.family for k in table.keys}
    out = []
    for owner, kind in owners.items():
        extra = sorted(k for k in unexpected if k.startswith(owner + "."))
        lost = sorted(k for k in missing if k.startswith(owner + "."))
        why = FAMILIES[kind].mismatch(owner, extra, lost) if kind in FAMILIES else None
        if why is not None:
            out.append(FamilyMismatch(owner, kind, why))
    return out


@public("reconcile")
def reconcile(program: Program, name: str, state_dict_or_shapes: Mapping[str, Any],
              dims: Mapping[str, int] | None = None) -> Reconciliation:
    """Compare block ``name``'s keys with a state_dict (tensors) or a key → shape mapping."""
    _checked_arguments(program, name, state_dict_or_shapes)
    table = param_keys(program, name, dims)  # sizes are validated, with located diagnostics, by Sizes
    expected = table.shapes
    given = {k: _shape(k, v) for k, v in state_dict_or_shapes.items()}
    unchecked = sorted(k for k in given if any(k.startswith(p + ".") for p in table.unknown))
    # a tied head's table loads from either of its two names (the compiled module copies one to the other)
    aliases = table.aliases
    missing = {k for k in expected if k not in given and not (k in aliases and aliases[k] in given)
               and not (k in aliases.values() and any(a in given for a, src in aliases.items() if src == k))}
    unexpected = {k for k in given if k not in expected and k not in unchecked}
    misshaped = tuple((k, expected[k], given[k]) for k in expected if k in given and not fits(expected[k], given[k]))
    return Reconciliation(name, tuple(sorted(missing)), tuple(sorted(unexpected)), misshaped,
                          tuple(_families(table, missing, unexpected)), tuple(unchecked))
