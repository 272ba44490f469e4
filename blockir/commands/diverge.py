"""`blockir diverge A.block [B.block]`: the first IR value where two compiled modules disagree.

Both sides are compiled from one seed (so equal keys get equal initial weights), optionally
loaded from run checkpoints, put in eval mode (no dropout: the comparison replays no randomness)
and traced on one input; the values are compared in A's execution order under ``--policy``.
B defaults to A, so ``--backend-b fused`` or ``--dtype-b bf16`` checks one program on two
backends or precisions. Exit 0 when every value agrees, 1 at a divergence (as ``diff``).
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from blockir.cli import (EXIT_ERRORS, EXIT_OK, UsageError, add_block_option, add_dims_option, add_format_option,
                         load_program, log, print_json, target_block, user_class, with_callees)
from blockir.commands.run import name_stand_ins, row_dims, set_threads
from blockir.diagnostics import BlockError, Span, error
from blockir.ir.decls import ExternDecl

DTYPES = ("f32", "bf16", "f16", "f64")


def _module(program: Any, block: Any, dims: dict[str, int], seed: int, backend: str, dtype: str,
            ckpt: str | None) -> Any:
    import torch

    from blockir.lifecycle import checkpoint, state_check
    from blockir.lower.compile import compile as compile_block
    from blockir.lifecycle.session import stand_ins
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        m = compile_block(program, block.name, backend, dims=dims, bind=stand_ins(program, block, dims), seed=seed)
    if ckpt is not None:
        _, files = checkpoint.read(ckpt)  # the files are checked against their recorded hashes before they are trusted
        where = str(Path(ckpt) / "model.pt")
        state = state_check.load_bytes(files["model.pt"], where)
        if not isinstance(state, dict):
            raise state_check.state_error(f"holds a {type(state).__name__}, not a parameter table", where)
        core = {k[len("core."):]: v for k, v in state.items() if isinstance(k, str) and k.startswith("core.")}
        m.load_state_dict(state_check.tensors(core, m.state_dict(), where, block.name), strict=True)
    dt = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16, "f64": torch.float64}[dtype]
    return m.to(dt).eval(), dt


def _implementation(target: str, width: int, eps: float | None) -> Any:
    """``PATH.py:CLASS`` built as a norm module is: ``CLASS(width, eps=eps)``."""
    path, sep, cls_name = target.rpartition(":")
    if not sep or not path.endswith(".py") or not cls_name.isidentifier():
        raise UsageError(f"--bind expects NAME=PATH.py:CLASS, got '{target}'")
    cls = user_class(path, cls_name, "blockir_bound")
    keywords = {} if eps is None else {"eps": eps}
    try:
        return cls(width, **keywords)
    except Exception as exc:  # the user's constructor
        raise BlockError([error("E0910", f"{cls_name}({width}, **{keywords}) fails: {type(exc).__name__}: {exc}",
                                Span(path, 1, 1),
                                hint="an extern norm is built as its norm is: CLASS(D, eps=…)")]) from None


def _contracts(args: argparse.Namespace, program: Any, block: Any, dims: dict[str, int]) -> int:
    """``--bind``: each bound extern norm against the built-in norm its contract states."""
    import torch

    from blockir.analyses.sizes import Sizes
    from blockir.lifecycle.diverge import POLICIES
    from blockir.lifecycle.extern_norms import check_contract, contract_diagnostic, reference_text
    externs = {d.name: d for b in with_callees(program, block) for d in b.decls
               if isinstance(d, ExternDecl) and d.contract is not None}
    sizes = Sizes.of(program, dims)
    policy = POLICIES[args.policy]
    dtype = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16, "f64": torch.float64}[args.dtype]
    reports, failures = [], []
    for item in args.bind:
        name, sep, target = item.partition("=")
        if not sep:
            raise UsageError(f"--bind expects NAME=PATH.py:CLASS, got '{item}'")
        decl = externs.get(name)
        if decl is None:
            raise UsageError(f"'{name}' is no extern norm of {block.name} (extern norms: "
                             f"{', '.join(externs) or 'none'})")
        norm = decl.contract.norm
        eps = float(sizes.value(norm.arg("eps"))) if norm.arg("eps") is not None else None
        module = _implementation(target, sizes.dim(norm.arg("axes")[-1]), eps).to(dtype).eval()
        checks = check_contract(decl, module, sizes, policy, args.seed, dtype)
        found = contract_diagnostic(decl, target, checks, policy)
        if found is not None:
            failures.append(found)
        reports.append({"extern": name, "module": target, "reference": reference_text(decl),
                        "results": [{"role": c.role, "index": c.index, "max_error": c.max_error, "bound": c.bound,
                                     "passed": c.passed} for c in checks]})
        if args.format != "json":
            print(f"{decl.span}: {name} = {target} against {reference_text(decl)} "
                  f"({policy.name} policy, atol {policy.atol:g}, rtol {policy.rtol:g})")
            for c in checks:
                what = f"result {c.index} ({c.role})" if c.index is not None else f"gradient {c.role}"
                print(f"  {what}: max error {c.max_error:.3e}, bound {c.bound:.3e}{'' if c.passed else '  FAILS'}")
    if args.format == "json":
        print_json({"file": args.a, "policy": {"name": policy.name, "atol": policy.atol, "rtol": policy.rtol},
                    "seed": args.seed, "externs": reports})
    if failures:
        raise BlockError(failures, {args.a: Path(args.a).read_text(encoding="utf-8")})
    return EXIT_OK


def diverge(args: argparse.Namespace) -> int:
    import torch

    from blockir.lifecycle.diverge import POLICIES, first_divergence, producer
    from blockir.lifecycle.session import random_inputs
    from blockir.lower.trace import trace
    set_threads(1)
    pa = load_program(args.a)
    if args.bind:
        if args.b:
            raise UsageError("--bind measures the externs of one file: give no B.block")
        block = target_block(pa, args.block)
        return _contracts(args, pa, block, row_dims(pa, args.dims))
    pb = load_program(args.b) if args.b else pa
    ba = target_block(pa, args.block)
    bb = target_block(pb, args.block_b or (args.block if args.block in pb.block_map else None)) if args.b else ba
    name_stand_ins(pa, ba)
    dims = row_dims(pa, args.dims)
    ma, da = _module(pa, ba, dims, args.seed, args.backend, args.dtype, args.checkpoint_a)
    mb, db = _module(pb, bb, row_dims(pb, args.dims), args.seed, args.backend_b or args.backend,
                     args.dtype_b or args.dtype, args.checkpoint_b or args.checkpoint_a)
    inputs = random_inputs(pa, ba, dims, torch.Generator().manual_seed(args.seed))
    with torch.no_grad():
        _, va = trace(ma, *(x.to(da) for x in inputs))
        _, vb = trace(mb, *(x.to(db) for x in inputs))
    policy = POLICIES[args.policy]
    found, compared = first_divergence(va, vb, policy)
    where = f"{args.a}:{ba.name}" + (f" vs {args.b}:{bb.name}" if args.b else "")
    if args.format == "json":
        print_json({"a": args.a, "b": args.b or args.a, "policy": {"name": policy.name, "atol": policy.atol,
                                                                    "rtol": policy.rtol},
                    "compared": compared, "divergence": None if found is None else {
                        "value": found.value, "op": producer(pa, ba, found.value), "max_error": found.max_error,
                        "bound": found.bound, "reason": found.reason, "agreed_before": found.agreed}})
    elif found is None:
        print(f"{where}: all {compared} values agree within the {policy.name} policy "
              f"(atol {policy.atol:g}, rtol {policy.rtol:g})")
    else:
        op = producer(pa, ba, found.value)
        print(f"{where}: first divergent value {found.value}" + (f" ({op})" if op else ""))
        print(f"  max |B - A| = {found.max_error:.3e} > bound {found.bound:.3e} ({found.reason}; {policy.name} policy, "
              f"atol {policy.atol:g}, rtol {policy.rtol:g})")
        print(f"  {found.agreed} value{'s' if found.agreed != 1 else ''} before it agree")
    log(f"compared {compared} values on one input of seed {args.seed}")
    return EXIT_OK if found is None else EXIT_ERRORS


def register(sub: argparse._SubParsersAction) -> None:
    r = sub.add_parser("diverge", help="the first IR value where two modules (files, backends, dtypes or "
                                       "checkpoints) disagree beyond a tolerance policy")
    r.add_argument("a", metavar="A.block")
    r.add_argument("b", metavar="B.block", nargs="?", help="the candidate (default: A again)")
    add_block_option(r)
    r.add_argument("--block-b", metavar="NAME", help="the block of B (default: --block's name if B has it)")
    add_dims_option(r)
    r.add_argument("--seed", type=int, default=0, help="seed of both initialisations and of the input")
    r.add_argument("--backend", choices=("fx", "fused"), default="fx")
    r.add_argument("--backend-b", choices=("fx", "fused"), help="B's backend (default: --backend)")
    r.add_argument("--dtype", choices=DTYPES, default="f32", help="A's parameter and input dtype (default f32)")
    r.add_argument("--dtype-b", choices=DTYPES, help="B's dtype (default: --dtype)")
    r.add_argument("--checkpoint-a", metavar="DIR", help="load A's block from a `run --save` checkpoint")
    r.add_argument("--checkpoint-b", metavar="DIR", help="load B's block from a checkpoint (default: A's)")
    r.add_argument("--policy", choices=("fp32", "bf16"), default="fp32",
                   help="fp32: atol=rtol=1e-5; bf16: rtol 2**-6, atol 1e-2 against the fp32 side")
    r.add_argument("--bind", action="append", default=[], metavar="NAME=PATH.py:CLASS",
                   help="measure the extern norm NAME, built as CLASS(D, eps=…) from PATH.py, against the built-in "
                        "norm its contract states (repeatable; no B.block)")
    add_format_option(r)
    r.set_defaults(func=diverge)
