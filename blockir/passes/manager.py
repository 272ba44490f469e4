"""The pass manager: run rewrites in order and re-verify after each one that changed the program.

Every rewrite has one contract, ``(program) -> (program, changed)``. A rewrite
that turns a verified program into one that fails verification is a bug in
blockir, not in the user's file, so it is reported as such (E0707) with the
verifier's own diagnostics attached.
"""
from __future__ import annotations

from typing import Callable, Sequence

from blockir.diagnostics import BlockError, Span, error
from blockir.ir.program import Program
from blockir.verifiers.registry import run_verifiers

Rewrite = Callable[[Program], tuple[Program, bool]]


def run_rewrites(program: Program, rewrites: Sequence[tuple[str, Rewrite]], verify: bool = True) -> Program:
    """Apply ``rewrites`` (name, function) in order; with ``verify``, check the program after each change."""
    for name, rewrite in rewrites:
        new, changed = rewrite(program)
        if changed and verify:
            errors = [d for d in run_verifiers(new) if d.is_error]
            if errors:
                raise BlockError([error("E0707", f"the '{name}' rewrite produced a program that does not verify",
                                        Span(program.filename, 1, 1),
                                        hint="this is a bug in blockir: please report it with the file")] + errors)
        program = new
    return program
