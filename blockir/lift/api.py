"""``blockir.lift(module, *args, **kwargs)``: the topology of existing PyTorch code as a checked ``.block``."""
from __future__ import annotations

import contextlib
import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch
from torch import Tensor, nn

from blockir.api import parse, verify
from blockir.diagnostics import BlockError, Diagnostic, Note, Span, argument_error, error, render_all, sort_key
from blockir.ir.program import Program
from blockir.lift.blocks import Session, Text, emit
from blockir.lift.certificate import certify
from blockir.lift.final_norm import split_final_norm
from blockir.lift.lifter import LiftFailure
from blockir.lift.lm import LMFailure, certify_lm, lm_block, read_lm
from blockir.lift.replay import Replay
from blockir.lift.sources import source_text
from blockir.lift.trace import TraceFailure, bind_call, python_path, record_calls
from blockir.lower.declared import AXES_ATTR


@dataclass
class LiftResult:
    """What a lift found: the ``.block`` text, its diagnostics located in Python, and the certificate.

    ``max_error`` is None when the lift has errors (nothing was compiled to compare).
    """

    text: str
    diagnostics: list[Diagnostic]
    max_error: float | None
    program: Program | None = None
    block: str = ""
    bind: dict[str, tuple[nn.Module, Replay]] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not any(d.is_error for d in self.diagnostics)

    def render(self) -> str:
        return render_all(self.diagnostics, self.sources)


@contextlib.contextmanager
def _tracing(module: nn.Module) -> Iterator[None]:
    """Training mode, so dropout and stochastic depth are on the graph; buffers and flags restored."""
    flags = [(m, m.training) for m in module.modules()]
    buffers = {k: b.detach().clone() for k, b in module.named_buffers()}
    module.train()
    try:
        with python_path(), torch.random.fork_rng():
            yield
    finally:
        for m, flag in flags:
            m.training = flag
        with torch.no_grad():
            for k, b in module.named_buffers():
                if k in buffers:
                    b.copy_(buffers[k])


def _relocate(d: Diagnostic, text: Text, filename: str) -> Diagnostic:
    def where(span: Span) -> Span:
        entry = text.entries.get(span.line) if span.filename == filename else None
        if entry is None:
            return span
        first, second = (entry.line.detail, entry.line.site) if entry.kind == "decl" else (entry.line.site,
                                                                                         entry.line.detail)
        return first or second or span
    notes = tuple(Note(n.message, where(n.span) if n.span else None) for n in d.notes)
    return dataclasses.replace(d, span=where(d.span), notes=notes)


def _sources(diags: list[Diagnostic], text: str, filename: str) -> dict[str, str]:
    out = {filename: text}
    for d in diags:
        for span in [d.span, *(n.span for n in d.notes if n.span)]:
            if span.filename not in out and span.line > 0:
                src = source_text(span.filename)
                if src is not None:
                    out[span.filename] = src
    return out


def _verified(text: Text, session: Session, filename: str) -> tuple[Program | None, list[Diagnostic]]:
    """The emitted text parsed and verified, with the lift's own findings: the program and every diagnostic in
    order, or None and the parse's diagnostics, located in the user's source."""
    try:
        program = parse(text.text, filename)
    except BlockError as exc:
        return None, [_relocate(d, text, filename) for d in exc.diagnostics]
    return program, sorted([*(_relocate(d, text, filename) for d in verify(program)), *session.findings], key=sort_key)


def _class_span(module: nn.Module) -> Span:
    import inspect
    try:
        _, line = inspect.getsourcelines(type(module))
        return Span(inspect.getsourcefile(type(module)) or type(module).__name__, line, 1)
    except (OSError, TypeError):
        return Span(type(module).__name__, 0, 0)


def _failed(diag: Diagnostic) -> LiftResult:
    return LiftResult("", [diag], None, sources=_sources([diag], "", "<lift>"))


def _seq_names(module: nn.Module) -> tuple[str, str]:
    """The stream's sequence axis and the memory's: as a compiled block names them, else S and T."""
    axes = getattr(module, AXES_ATTR, ())
    stream = axes[0][1] if axes and len(axes[0]) == 3 else "S"
    return ("T", "S") if stream == "T" else ("S", "T")


def lift(module: nn.Module, *example_args: Any, filename: str = "<lift>", **example_kwargs: Any) -> LiftResult:
    """Lift ``module`` as called with the example arguments: topology, diagnostics, certificate."""
    if not isinstance(module, nn.Module):
        raise BlockError([argument_error("lift", "module", f"lift expects an nn.Module, got {type(module).__name__}")])
    try:
        call = bind_call(module, example_args, example_kwargs)
    except TypeError as exc:
        raise BlockError([argument_error("lift", "example_args", f"the example arguments do not fit "
                                         f"{type(module).__name__}.forward: {exc}")]) from None
    first = next((v for v in call.arguments.values() if isinstance(v, Tensor) and v.is_floating_point()), None)
    ids = next((v for v in call.arguments.values() if isinstance(v, Tensor) and not v.is_floating_point()), None)
    if first is None and ids is not None and ids.dim() == 2:
        return _lift_lm(module, ids, example_args, example_kwargs, filename)
    if first is None or first.dim() != 3:
        raise BlockError([argument_error("lift", "example_args", "the first floating tensor argument is the "
                                         "residual stream and must be [batch, seq, features]")])
    with _tracing(module):
        try:
            _, calls = record_calls(module, example_args, example_kwargs)
        except Exception as exc:  # the user's forward on the user's examples
            return _failed(error("E0900", f"{type(module).__name__} fails on the example inputs: "
                                 f"{type(exc).__name__}: {exc}", _class_span(module),
                                 hint="pass inputs the module accepts (--args, --dims)"))
        # what the compiled lift passes its built-in branches: the root's side inputs, by their names
        context = {n: v for n, v in call.arguments.items() if isinstance(v, (Tensor, tuple, list)) and v is not first}
        session = Session(calls, int(first.shape[-1]), int(first.shape[1]), context, _seq_names(module))
        try:
            root = session.lift_block(module, call, "", {})
        except LiftFailure as f:
            return _failed(f.diagnostic)
        except TraceFailure as exc:
            return _failed(error("E0900", f"torch.fx cannot trace {type(module).__name__}: {exc}", _class_span(module),
                                 hint="a forward that branches on tensor values cannot be traced symbolically; move "
                                      "such code into a branch submodule"))
    text = emit(split_final_norm(root, session, module), session, module)
    program, diags = _verified(text, session, filename)
    if program is None:
        return LiftResult(text.text, diags, None, None, text.root, text.bind, _sources(diags, text.text, filename))
    max_error = None
    if not any(d.is_error for d in diags):
        inputs = root.params
        ctx = [n for n in call.arguments if n not in inputs and isinstance(call.arguments[n], (Tensor, tuple, list))]
        try:
            max_error, more = certify(program, text.root, module, call, inputs, ctx, text.bind, _class_span(module))
        except BlockError as exc:
            more = exc.diagnostics
        except Exception as exc:  # the lifted module runs the user's branches on the user's inputs
            more = [error("E0912", f"the compiled lift fails where the original runs: {type(exc).__name__}: {exc}",
                          _class_span(module), hint="the lifted program is in .text; compile it to see where")]
        diags += more
    return LiftResult(text.text, diags, max_error, program, text.root, text.bind, _sources(diags, text.text, filename))


def _lift_lm(module: nn.Module, ids: Tensor, args: tuple, kwargs: dict[str, Any], filename: str) -> LiftResult:
    """A whole causal LM called on token ids: embedding, stack, final norm and head (see :mod:`blockir.lift.lm`)."""
    where = _class_span(module)
    import inspect
    if "use_cache" in inspect.signature(module.forward).parameters and "use_cache" not in kwargs:
        kwargs = {**kwargs, "use_cache": False}  # a KV cache is no part of the topology, and no layer traces with one
    with _tracing(module):
        try:
            lm, session = read_lm(module, ids, args, kwargs, where)
        except (LiftFailure, LMFailure) as f:
            return _failed(f.diagnostic)
        except TraceFailure as exc:
            return _failed(error("E0900", f"torch.fx cannot trace a layer of {type(module).__name__}: {exc}", where,
                                 hint="a forward that branches on tensor values cannot be traced symbolically"))
        except Exception as exc:  # the user's forward on the user's examples
            return _failed(error("E0900", f"{type(module).__name__} fails on the example inputs: "
                                 f"{type(exc).__name__}: {exc}", where, hint="pass token ids the model accepts"))
    root = lm_block(lm, re.sub(r"\W", "_", type(module).__name__) or "Model", module)
    text = emit(root, session, module)
    program, diags = _verified(text, session, filename)
    if program is None:
        return LiftResult(text.text, diags, None, None, text.root, text.bind, _sources(diags, text.text, filename))
    max_error = None
    reading = sorted(p for p, (_, replay) in text.bind.items() if replay.reads_context)
    if reading:
        diags.append(error("E0913", f"the layers' branches {', '.join(reading)} are externs that read the masks "
                           "or rotary tables the model builds, which the lifted model has none of", where,
                           hint="lift a layer on its own (blockir lift hf) to see its externs"))
    if not any(d.is_error for d in diags):
        try:
            max_error, more = certify_lm(program, text.root, module, ids, args, kwargs, text.bind, where)
        except BlockError as exc:
            more = exc.diagnostics
        except Exception as exc:  # the compiled lift runs on the user's inputs
            more = [error("E0912", f"the compiled lift fails where the original runs: {type(exc).__name__}: {exc}",
                          where, hint="the lifted program is in .text; compile it to see where")]
        diags += more
    return LiftResult(text.text, diags, max_error, program, text.root, text.bind, _sources(diags, text.text, filename))
