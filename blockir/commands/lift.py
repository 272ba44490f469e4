"""`blockir lift PATH.py:CLASS [--args JSON] [--dims B=2,S=16,D=64] [-o OUT.block]` and `blockir lift hf TYPE`.

Builds the module (a class of a Python file constructed with the JSON arguments, or a tiny random
instance of an installed transformers family), lifts it, prints the diagnostics located in the
Python source and the certificate on stderr, and the ``.block`` text on stdout or into ``-o``.
Exit 0 clean, 1 when the lift or a verifier reports an error, 2 on a usage problem.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from blockir.cli import EXIT_ERRORS, EXIT_OK, UsageError, add_dims_option, log, user_class
from blockir.diagnostics import BlockError, Span, error, render


def _write(path: str, text: str, force: bool) -> None:
    target = Path(path)
    if target.exists() and not force:
        raise UsageError(f"{path} exists; pass --force to replace it")
    from blockir.lifecycle.atomic import write_file
    write_file(target, text.encode())


def _constructor_args(text: str | None) -> tuple[list[Any], dict[str, Any]]:
    if text is None:
        return [], {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"--args is not JSON: {exc.msg} at character {exc.pos}") from None
    if isinstance(value, list):
        return value, {}
    if isinstance(value, dict):
        return [], value
    raise UsageError("--args must be a JSON list (positional) or object (keyword arguments)")


def _from_file(target: str, args: argparse.Namespace) -> tuple[Any, Any]:
    import torch

    path, sep, cls_name = target.rpartition(":")
    if not sep or not path.endswith(".py") or not cls_name.isidentifier():
        raise UsageError(f"expected PATH.py:ClassName or 'hf MODEL_TYPE', got '{target}'")
    positional, keywords = _constructor_args(args.args)
    cls = user_class(path, cls_name, "blockir_lift")
    try:
        module = cls(*positional, **keywords)
    except Exception as exc:  # the user's constructor
        raise BlockError([error("E0910", f"{cls_name}(*{positional}, **{keywords}) fails: {type(exc).__name__}: {exc}",
                                Span(path, 1, 1), hint="pass the constructor's arguments with --args JSON")]) from None
    width = args.dims.get("D") or next((p.shape[0] for p in module.parameters() if p.ndim == 1), None)
    if width is None:
        raise UsageError("cannot tell the model width; pass --dims D=…")
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(args.dims.get("B", 2), args.dims.get("S", 16), width, generator=gen)
    return module, ((x,), {})


def _hf(model_type: str, args: argparse.Namespace) -> tuple[Any, Any]:
    from blockir.lift.hf import FamilyFailure, hf_layer

    try:
        return hf_layer(model_type, args.dims.get("B", 2), args.dims.get("S", 16), args.dims.get("D", 64))
    except LookupError as exc:
        raise UsageError(f"no transformers family '{model_type}': {exc}") from None
    except FamilyFailure as exc:
        raise BlockError([error("E0911", str(exc), Span(f"hf {model_type}", 0, 0),
                                hint="pass sizes the family accepts with --dims D=…")]) from None


def run(args: argparse.Namespace) -> int:
    if args.target == "hf":
        if args.model_type is None:
            raise UsageError("blockir lift hf needs a MODEL_TYPE (llama, gpt2, bert, …)")
        module, (pos, kw) = _hf(args.model_type, args)
    else:
        if args.model_type is not None:
            raise UsageError(f"unexpected argument '{args.model_type}'")
        module, (pos, kw) = _from_file(args.target, args)
    from blockir.lift import lift

    result = lift(module, *pos, filename=args.output or "<lift>", **kw)
    for d in result.diagnostics:
        print(render(d, result.sources), file=sys.stderr)
    if result.text:
        if args.output:
            _write(args.output, result.text, args.force)
        else:
            print(result.text, end="")
    if result.max_error is not None:
        log(f"certificate: max relative error {result.max_error:.3g} (output and every gradient, against the original)")
    return EXIT_OK if result.ok else EXIT_ERRORS


def register(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("lift", help="recover the .block topology of a PyTorch module, verify and certify it")
    s.add_argument("target", metavar="PATH.py:CLASS | hf", help="a module class of a Python file, or 'hf'")
    s.add_argument("model_type", nargs="?", metavar="MODEL_TYPE", help="with 'hf': a transformers model type")
    s.add_argument("--args", metavar="JSON", help="constructor arguments: a JSON list or object")
    add_dims_option(s)
    s.add_argument("-o", "--output", metavar="OUT.block", help="write the .block text here instead of stdout")
    s.add_argument("--force", action="store_true", help="replace an existing --output file")
    s.set_defaults(func=run)
