"""DeepNorm constants: α (the shortcut constant) and β (the init gain) follow the DeepNet table.

DeepNet (Wang et al., 2022) gives each architecture its own row: encoder-only
and decoder-only stacks of L layers, and the encoder and decoder sides of an
encoder–decoder. A Post-LN sum whose shortcut a constant scales is DeepNorm's;
its constants, and the init gains of every block it runs inside the same
stacked layer (a nested cross-attention sublayer, say), are checked against the
row of the stacked layer they run in. A block instanced once inside a stack is
built with ``num_layers = 1``: a constant written in ``num_layers`` there reads
the depth 1, not the stack's.
"""
from __future__ import annotations

import math
from typing import Iterator

from blockir.analyses.sizes import block_env, enclosing_stacks, program_env, uses_layer, value
from blockir.analyses.structure import wrapper
from blockir.analyses.summaries import summaries
from blockir.diagnostics import Diagnostic, error
from blockir.ir import consts as C
from blockir.ir.consts import ConstExpr
from blockir.ir.decls import KindDecl
from blockir.ir.traits import Scales
from blockir.ops import Op
from blockir.ir.program import Block, Program
from blockir.verifiers.registry import verifier

ALPHA = {"single": lambda n, m: (2 * n) ** 0.25, "decoder": lambda n, m: (3 * m) ** 0.25,
         "encoder": lambda n, m: 0.81 * (n ** 4 * m) ** (1 / 16)}
BETA = {"single": lambda n, m: (8 * n) ** -0.25, "decoder": lambda n, m: (12 * m) ** -0.25,
        "encoder": lambda n, m: 0.87 * (n ** 4 * m) ** (-1 / 16)}
ROW = {"single": "the encoder-only / decoder-only row, (2L)^(1/4) and (8L)^(-1/4)",
       "decoder": "the encoder–decoder decoder row, (3M)^(1/4) and (12M)^(-1/4)",
       "encoder": "the encoder–decoder encoder row, 0.81(N^4 M)^(1/16) and 0.87(N^4 M)^(-1/16)"}
Context = tuple[str, int, bool]  # (the stacked layer a block runs in, its depth, whether it is the block itself)


def shortcut_scales(block: Block) -> list[Op]:
    """The constant shortcut scales of the block's Post-LN sums (DeepNorm's alpha sites)."""
    out: list[Op] = []
    for s in wrapper(block).sublayers:
        if s.post_norm is not None:
            out += [op for op in s.shortcut_ops if op.has(Scales) and op.factor is not None]
        elif s.fused_post and s.root.shortcut_scale() is not None:
            out.append(s.root)
    return out


def _factor(op: Op) -> ConstExpr:
    return op.factor if op.has(Scales) else op.shortcut_scale()  # type: ignore[union-attr,return-value]


def contexts(program: Program, block: Block, stacks: dict[str, tuple[tuple[str, int], ...]]) -> list[Context]:
    """Where the block runs: each stacked layer around it (itself when stacked), or alone as a stack of 1."""
    found = [(layer, n, layer == block.name) for layer, n in stacks.get(block.name, ())]
    return found or [(block.name, 1, True)]


def architecture(program: Program, layer: str, depth: int, alone: bool,
                 stacks: dict[str, tuple[tuple[str, int], ...]]) -> tuple[str, int, int]:
    """(row of the DeepNet table, N encoder layers, M decoder layers) for a stacked layer of ``depth`` layers: a
    layer that reads memory is a decoder; another stacked layer of a program that stacks a decoder, the encoder."""
    facts = summaries(program)
    stacked = [(b.name, n) for b in program.blocks if b.kind == "block"
               for layer_name, n in stacks.get(b.name, ()) if layer_name == b.name]
    if facts[layer].has_cross:
        encoders = [n for name, n in stacked if not facts[name].has_cross]
        return "decoder", encoders[0] if encoders else depth, depth
    decoders = [n for name, n in stacked if facts[name].has_cross]
    if decoders and not alone:
        return "encoder", depth, decoders[0]
    return "single", depth, depth


def alpha_values(program: Program, block: Block, stacks: dict[str, tuple[tuple[str, int], ...]]) -> list[float]:
    """Every α of the DeepNet table for the architectures the block runs in, at the depth each context gives
    and at the depth 1 a single instance reads."""
    out = []
    for layer, depth, own in contexts(program, block, stacks):
        arch, n, m = architecture(program, layer, depth, own and layer not in stacks, stacks)
        out += [f(n, m) for f in ALPHA.values()] + [f(1, 1) for f in ALPHA.values()]
    return out


def _one_layer(arch: str, n: int, m: int) -> tuple[int, int]:
    """The (N, M) a constant written in ``num_layers`` reads in a block instanced once on this side."""
    return (n, 1) if arch == "decoder" else (1, m) if arch == "encoder" else (1, 1)


def _arch_words(arch: str, n: int, m: int) -> str:
    if arch == "decoder":
        return f"the decoder of an encoder–decoder (it reads memory through cross-attention; M = {m})"
    if arch == "encoder":
        return f"the encoder of an encoder–decoder (N = {n}, M = {m})"
    return f"a single stack of L = {n} layers"


def _sites(block: Block) -> list[tuple[str, ConstExpr, dict, object]]:
    scales = shortcut_scales(block)
    gains = [d for d in block.decls if isinstance(d, KindDecl) and d.arg("init_gain") is not None]
    sites: list[tuple[str, ConstExpr, dict, object]] = [("alpha", _factor(scales[0]), ALPHA, scales[0])] if scales \
        else []
    return sites + [("beta", d.arg("init_gain"), BETA, d) for d in gains[:1]]


def _check(program: Program, block: Block, base: dict, layer: str, depth: int, own: bool, arch: str, n: int,
           m: int) -> Iterator[Diagnostic]:
    env = block_env(base, block, 0, depth if own else 1)
    for name, expr, table, site in _sites(block):
        if uses_layer(expr, block):
            continue
        got = value(expr, env)
        if got is None:
            continue
        want = table[arch](n, m)
        if math.isclose(got, want, rel_tol=1e-9):
            continue
        row = next((r for r in table if math.isclose(got, table[r](n, m), rel_tol=1e-9)), None)
        span = site.span  # type: ignore[attr-defined]
        if row is not None:
            yield error("E0410", f"DeepNorm {name} = {got:.6g} follows {ROW[row]}, but '{block.name}' is "
                        f"{_arch_words(arch, n, m) if own else 'in ' + repr(layer) + ', ' + _arch_words(arch, n, m)}: "
                        f"{name} should be {want:.6g}", span,
                        hint=f"DeepNet's constants depend on the architecture; use {ROW[arch]}")
        elif not own and depth > 1 and uses_layer(expr, block, C.NUM_LAYERS) \
                and math.isclose(got, table[arch](*_one_layer(arch, n, m)), rel_tol=1e-9):
            yield error("E0410", f"DeepNorm {name} = {got:.6g} reads num_layers = 1: '{block.name}' is instanced "
                        f"once inside '{layer}', which is {_arch_words(arch, n, m)}, stacked {depth} times; {name} "
                        f"should be {want:.6g}", span,
                        hint=f"a block instanced once is built with num_layers = 1: write the stack's depth as a "
                             f"file constant and use it here, or move this sublayer into '{layer}'")


@verifier("deepnorm")
def verify_deepnorm(program: Program) -> list[Diagnostic]:
    base = program_env(program)
    stacks = enclosing_stacks(program, base)
    deep = {layer for b in program.blocks if shortcut_scales(b) for layer, _, _ in contexts(program, b, stacks)}
    out: list[Diagnostic] = []
    for block in program.blocks:
        for layer, depth, own in contexts(program, block, stacks):
            if layer not in deep:
                continue
            arch, n, m = architecture(program, layer, depth, own and layer not in stacks, stacks)
            found = list(_check(program, block, base, layer, depth, own, arch, n, m))
            if found:
                out += found
                break  # one context is enough to show the constant wrong
    return out
