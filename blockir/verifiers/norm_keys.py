"""Parameter names a norm declaration gives its state: two parameters under one key cannot both load."""
from __future__ import annotations

from collections import Counter

from blockir.norms import family
from blockir.diagnostics import Diagnostic, error
from blockir.ir.decls import KindDecl
from blockir.ir.program import Program
from blockir.verifiers.registry import verifier


@verifier("norm_keys")
def verify_norm_keys(program: Program) -> list[Diagnostic]:
    out: list[Diagnostic] = []
    for block in program.blocks:
        for d in block.decls:
            if not isinstance(d, KindDecl) or d.category != "norm":
                continue
            counts = Counter(name for name, _ in family(d).keys(d, ()))
            for key in (k for k, n in counts.items() if n > 1):
                out.append(error("E0444", f"{d.kind} '{d.name}' stores two parameters under the key '{d.name}.{key}'",
                                 d.span, hint="give the gain and the shift different names (weight_name=…, "
                                              "bias_name=…); DyT also owns 'alpha'"))
    return out
