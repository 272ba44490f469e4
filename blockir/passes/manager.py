"""The pass contract and the manager every rewrite runs through.

A pass is a name and a function ``program -> PassResult``: the new program, whether it changed, and
what the pass found beside the program (a fold's weight edits and log, a recipe's report). The
manager runs passes in order and re-verifies the program after each one that changed it. A pass that
turns a verified program into one that fails verification is a bug in blockir, not in the user's
file, so it is reported as such (E0707), naming the pass, with the verifier's own diagnostics attached.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Generic, Sequence, TypeVar

from blockir.diagnostics import BlockError, error
from blockir.ir.program import Program
from blockir.verifiers.registry import run_verifiers

T = TypeVar("T")


@dataclass(frozen=True)
class PassResult(Generic[T]):
    program: Program
    changed: bool
    detail: T


@dataclass(frozen=True)
class Pass(Generic[T]):
    """One rewrite: ``name`` is what a diagnostic calls it, ``rewrite`` maps a program to its result."""

    name: str
    rewrite: Callable[[Program], PassResult[T]]


def program_pass(name: str, rewrite: Callable[[Program], tuple[Program, bool]]) -> Pass[None]:
    """A ``(program) -> (program, changed)`` rewrite as a pass that finds nothing beside the program."""
    def run(program: Program) -> PassResult[None]:
        new, changed = rewrite(program)
        return PassResult(new, changed, None)
    return Pass(name, run)


def check(after: Program, name: str) -> None:
    """Raise E0707 when ``after``, the output of pass ``name``, fails verification."""
    errors = [d for d in run_verifiers(after) if d.is_error]
    if errors:
        # located where the verifier found the first error, the place the pass broke
        raise BlockError([error("E0707", f"the '{name}' pass produced a program that does not verify", errors[0].span,
                                hint="this is a bug in blockir: please report it with the file")] + errors)


def run_pass(program: Program, step: Pass[T], verify: bool = True) -> PassResult[T]:
    """Apply one pass; with ``verify``, check its program when it changed."""
    result = step.rewrite(program)
    if result.changed and verify:
        check(result.program, step.name)
    return result


def run_passes(program: Program, steps: Sequence[Pass[Any]], verify: bool = True) -> Program:
    """Apply ``steps`` in order, each to the program the previous one returned."""
    for step in steps:
        program = run_pass(program, step, verify).program
    return program
