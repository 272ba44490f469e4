"""The certificate: the compiled lift against the original, forward and every gradient.

Both run in evaluation mode (dropout off) on the example inputs, with the original's
``state_dict`` loaded strictly into the compiled module and the externs bound to the original
submodules. Gradients are taken with ``torch.autograd.grad`` so the caller's ``.grad`` fields stay
as they were. The error of one tensor is ``max |a - b| / max |b|``; the certificate is the largest
over the output, the input gradients and the gradient of every parameter.
"""
from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch
from torch import Tensor, nn

from blockir.diagnostics import Diagnostic, Span, error
from blockir.lift.replay import Replay
from blockir.lift.trace import Call, python_path


@contextlib.contextmanager
def evaluating(*modules: nn.Module) -> Iterator[None]:
    """Every module in eval mode, each submodule's own flag restored afterwards."""
    flags = [(m, m.training) for top in modules for m in top.modules()]
    for top in modules:
        top.eval()
    try:
        yield
    finally:
        for m, flag in flags:
            m.training = flag


def _first(out: Any) -> Tensor:
    while isinstance(out, (tuple, list)):
        out = out[0]
    return out


def _rel(a: Tensor, b: Tensor) -> float:
    scale = b.detach().abs().max().item() if b.numel() else 0.0
    diff = (a.detach() - b.detach()).abs().max().item() if b.numel() else 0.0
    return diff / scale if scale > 0 else diff


def invoke(module: nn.Module, call: Call, override: dict[str, Any]) -> Any:
    args = [override.get(n, call.arguments[n]) for n in call.positional]
    kwargs = {n: override.get(n, v) for n, v in call.arguments.items() if n not in call.positional}
    return module(*args, **kwargs)


def certify(program: Any, root: str, module: nn.Module, call: Call, inputs: list[str], ctx: list[str],
            bind: dict[str, tuple[nn.Module, Replay]], where: Span) -> tuple[float | None, list[Diagnostic]]:
    from blockir.lower.boundary import reads
    from blockir.lower.compile import compile

    sizes = {"B": int(call.arguments[inputs[0]].shape[0]), "S": int(call.arguments[inputs[0]].shape[1])}
    if len(inputs) > 1:
        sizes["T"] = int(call.arguments[inputs[1]].shape[1])
    compiled = compile(program, root, dims={k: v for k, v in sizes.items() if k in program.dims}, bind=bind)
    state = module.state_dict()
    missing, unexpected = [], []
    own = compiled.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    if missing or unexpected:
        listed = ", ".join((unexpected or missing)[:6])
        return None, [error("E0908", f"the original state_dict does not load strictly into the lift: "
                            f"{'keys the lift lacks' if unexpected else 'keys the original lacks'}: {listed}", where,
                            hint="every parameter must sit in a recognised norm, gain or branch submodule")]
    compiled.load_state_dict(state, strict=True)
    xs = {n: call.arguments[n].detach().clone().requires_grad_(True) for n in inputs}
    ys = {n: call.arguments[n].detach().clone().requires_grad_(True) for n in inputs}
    with evaluating(module, compiled), python_path():
        ref = _first(invoke(module, call, xs))
        # side inputs only a recognised built-in read (litgpt's cos, sin) are not the lift's: it builds its own
        got = _first(compiled(*(ys[n] for n in inputs), **{k: call.arguments[k] for k in ctx if reads(compiled, k)}))
    worst = _rel(got, ref)
    gen = torch.Generator().manual_seed(0)
    cotangent = torch.randn(ref.shape, generator=gen, dtype=ref.dtype)
    p_ref = dict(module.named_parameters())
    p_got = dict(compiled.named_parameters())
    keys = [k for k in p_ref if k in p_got and p_ref[k].requires_grad]
    g_ref = torch.autograd.grad(ref, [*xs.values(), *(p_ref[k] for k in keys)], cotangent, allow_unused=True)
    g_got = torch.autograd.grad(got, [*ys.values(), *(p_got[k] for k in keys)], cotangent, allow_unused=True)
    for a, b in zip(g_got, g_ref):
        if a is None or b is None:
            if (a is None) != (b is None):
                worst = max(worst, 1.0)
            continue
        worst = max(worst, _rel(a, b))
    return worst, []
