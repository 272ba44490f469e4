"""LayerDrop: a whole layer skipped for the whole batch, no rescale, one draw per (seed, layer).

The reference reads the draw from the documented identity (the dropout key of
``(seed, layer, site_id("layer_drop"))`` tested like one mask element) and
applies the layer's equation, in float64, for the output and every gradient.
"""
from __future__ import annotations

import pytest
import torch
from torch import Tensor

import blockir
from blockir.lower.fx import SEED_HIGH, site_id
from blockir.lower.rng import KEEP_BITS, dropout_key, fmix32
from blockir.ops import LayerDropOp
from blockir.ir.printer import format_program

HEADER = """
dim B: batch
dim S: seq
dim D: model = 8
"""
D, N, P = 8, 6, 0.5
STACK = HEADER + f"""
block Layer(x: [B, S, D]) -> [B, S, D] {{
  ln: layernorm(D, accum=f64)
  ff: linear(D, D)
  ln_2: rmsnorm(D, accum=f64)
  ff_2: linear(D, D, bias=false)
  h = x + layer_drop(ff(ln(x)), p={P})
  y = h + layer_drop(ff_2(ln_2(h)), p={P})
  return y
}}

model T(x: [B, S, D]) -> [B, S, D] {{
  const final_norm = 0
  layers: Layer * {N}
  return layers(x)
}}
"""


def _kept(seed: int, layer: int, p: float) -> bool:
    key = dropout_key(seed, layer, site_id("layer_drop"))
    return (fmix32(key) >> (32 - KEEP_BITS)) >= int(p * (1 << KEEP_BITS))


def _layer(x: Tensor, p: dict[str, Tensor], i: int, kept: bool) -> Tensor:
    if not kept:
        return x
    w = lambda name: p[f"layers.{i}.{name}"]  # noqa: E731
    mu = x.mean(-1, keepdim=True)
    n = (x - mu) / torch.sqrt(((x - mu) ** 2).mean(-1, keepdim=True) + 1e-5) * w("ln.weight") + w("ln.bias")
    h = x + n @ w("ff.weight").T + w("ff.bias")
    r = h / torch.sqrt((h * h).mean(-1, keepdim=True) + 1e-6) * w("ln_2.weight")
    return h + r @ w("ff_2.weight").T


def _run_seeds() -> tuple[int, list[int]]:
    """A generator state under which the layers' seeds (one draw per layer forward, in order) keep some
    layers and drop others."""
    for state in range(100):
        torch.manual_seed(state)
        seeds = [int(torch.randint(0, SEED_HIGH, (), dtype=torch.int64)) for _ in range(N)]
        kept = [_kept(seed, i, P) for i, seed in enumerate(seeds)]
        if any(kept) and not all(kept):
            return state, seeds
    raise AssertionError("no generator state mixes kept and dropped layers")


@pytest.mark.parametrize("backend", ["fx", "fused"])
def test_layer_drop_skips_whole_layers_without_rescale(backend: str) -> None:
    m = blockir.compile(blockir.parse(STACK), "T", seed=0, backend=backend, dtype=torch.float64)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for q in m.parameters():
            q.add_(0.3 * torch.randn(q.shape, generator=gen, dtype=torch.float64))
    x = torch.randn(2, 3, D, generator=gen, dtype=torch.float64, requires_grad=True)
    state, seeds = _run_seeds()
    torch.manual_seed(state)
    y = m(x)
    grad_out = torch.randn(y.shape, generator=gen, dtype=torch.float64)
    got = torch.autograd.grad(y, [x, *m.parameters()], grad_out, allow_unused=True)

    params = {n: q.detach().clone().requires_grad_(True) for n, q in m.named_parameters()}
    x_ref = x.detach().clone().requires_grad_(True)
    want_y = x_ref
    for i in range(N):
        want_y = _layer(want_y, params, i, _kept(seeds[i], i, P))
    want = torch.autograd.grad(want_y, [x_ref, *params.values()], grad_out, allow_unused=True)
    torch.testing.assert_close(y, want_y, rtol=1e-10, atol=1e-10)
    for name, g, w in zip(["x", *params], got, want):
        g = torch.zeros_like(params[name] if name != "x" else x) if g is None else g
        w = torch.zeros_like(g) if w is None else w
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-10, msg=lambda msg, n=name: f"gradient of {n}: {msg}")

    m.eval()  # no draw in inference: every layer runs
    want_eval = x_ref
    for i in range(N):
        want_eval = _layer(want_eval, params, i, True)
    torch.testing.assert_close(m(x), want_eval, rtol=1e-10, atol=1e-10)


def test_layer_drop_draw_is_shared_by_the_layer_and_independent_of_other_sites() -> None:
    # the layer's identity is (seed, layer): renaming values or adding dropouts does not move it
    renamed = STACK.replace("h = x", "mid = x").replace("(h))", "(mid))").replace("y = h", "y = mid")
    outs = []
    for text in (STACK, renamed):
        m = blockir.compile(blockir.parse(text), "T", seed=0, backend="fx", dtype=torch.float64)
        torch.manual_seed(3)
        outs.append(m(torch.ones(2, 3, D, dtype=torch.float64)))
    torch.testing.assert_close(outs[0], outs[1], rtol=0, atol=0)


def test_layer_drop_is_its_own_kind_and_round_trips() -> None:
    program = blockir.parse(STACK)
    ops = [op for op in program.block("Layer").ops if isinstance(op, LayerDropOp)]
    assert len(ops) == 2 and all(op.mask == "layer" for op in ops)
    drop_path = blockir.parse(STACK.replace("layer_drop(", "drop_path("))
    assert drop_path != program
    printed = format_program(program)
    assert "layer_drop(%1, p=0.5)" in printed
    assert blockir.parse(printed) == program
    assert [d for d in blockir.verify(program) if d.is_error] == []


def _errors(body: str) -> list[tuple[str, str]]:
    return [(d.code, d.message) for d in blockir.verify(blockir.parse(HEADER + body)) if d.is_error]


def test_layer_drop_on_one_update_only_is_reported() -> None:
    body = """
block L(x: [B, S, D]) -> [B, S, D] {
  ff: linear(D, D)
  ff_2: linear(D, D)
  h = x + layer_drop(ff(x), p=0.1)
  y = h + ff_2(h)
  return y
}"""
    assert _errors(body) == [("E0415", "the update 'ff_2(…)' is not layer-dropped while 'layer_drop(…)' is: a "
                                       "dropped layer would still apply it")]


def test_layer_drop_with_two_probabilities_is_reported() -> None:
    body = """
block L(x: [B, S, D]) -> [B, S, D] {
  ff: linear(D, D)
  ff_2: linear(D, D)
  h = x + layer_drop(ff(x), p=0.1)
  y = h + layer_drop(ff_2(h), p=0.2)
  return y
}"""
    assert _errors(body) == [("E0415", "layer_drop with p=0.2 in a layer whose first layer_drop has p=0.1: one "
                                       "draw decides the whole layer")]


def test_layer_drop_under_a_normalized_sum_is_reported() -> None:
    body = """
block L(x: [B, S, D]) -> [B, S, D] {
  ff: linear(D, D)
  ln: layernorm(D)
  y = ln(x + layer_drop(ff(x), p=0.1))
  return y
}"""
    assert [c for c, _ in _errors(body)] == ["E0415"]


def test_layer_drop_inside_an_update_is_reported() -> None:
    body = """
block L(x: [B, S, D]) -> [B, S, D] {
  ff: linear(D, D)
  ff_2: linear(D, D)
  y = x + ff_2(layer_drop(ff(x), p=0.1))
  return y
}"""
    codes = [c for c, _ in _errors(body)]
    assert codes == ["E0415", "E0415"]
