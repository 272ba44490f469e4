"""Compiled blocks against formulas written out here: norms, dropout, residual scales, DeepNorm, casts.

Every test compiles a small block text with the fx backend and checks what
the module computes against the formula of the norm, dropout policy or
scaling recipe it declares.
"""
from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint

import blockir

ROOT = Path(__file__).resolve().parent.parent
HEADER = """
dim B: batch
dim S: seq
dim D: model = 8
dim F: hidden = 16
"""
D = 8


def _compile(body: str, name: str = "T", **kwargs: object) -> torch.fx.GraphModule:
    return blockir.compile(blockir.parse(HEADER + body), name, seed=0, **kwargs)


def _x(*shape: int, seed: int = 0, scale: float = 1.0, shift: float = 0.0,
       dtype: torch.dtype = torch.float32) -> Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=gen, dtype=torch.float64) * scale + shift).to(dtype)


def _randomize(m: torch.nn.Module, seed: int = 1) -> None:
    """Move every parameter off its init (a wrong offset or dropped bias would match at init)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=gen, dtype=torch.float64).to(p.dtype))


def _norm_block(decl: str) -> str:
    return f"block T(x: [B, S, D]) -> [B, S, D] {{\n  n: {decl}\n  y = n(x)\n  return y\n}}"


# ------------------------------------------------------------ LayerNorm


def _layer_norm(x: Tensor, w: Tensor, b: Tensor, eps: float, denom: int | None = None,
                eps_inside: bool = True) -> Tensor:
    """mu = sum/d, var = sum((x - mu)^2)/d (biased), y = w (x - mu)/sqrt(var + eps) + b."""
    d = x.shape[-1]
    mu = x.sum(-1, keepdim=True) / d
    var = ((x - mu) ** 2).sum(-1, keepdim=True) / (denom or d)
    root = torch.sqrt(var + eps) if eps_inside else torch.sqrt(var) + eps
    return w * (x - mu) / root + b


def test_layernorm_is_the_formula() -> None:
    # a large eps and a small width make the variance denominator and the eps placement visible
    m = _compile(_norm_block("layernorm(D, eps=0.1)"))
    _randomize(m)
    w, b = m.n.weight.detach().double(), m.n.bias.detach().double()
    x = _x(3, 5, D, scale=0.5, shift=2.0)
    y = m(x)
    want = _layer_norm(x.double(), w, b, 0.1)
    torch.testing.assert_close(y.double(), want, rtol=1e-6, atol=1e-6)
    # the wrong variants are far away, so the comparison above separates them
    assert (_layer_norm(x.double(), w, b, 0.1, denom=D - 1) - want).abs().max() > 1e-2
    assert (_layer_norm(x.double(), w, b, 0.1, eps_inside=False) - want).abs().max() > 1e-2


def test_layernorm_constant_row_gives_the_bias() -> None:
    m = _compile(_norm_block("layernorm(D, eps=1e-5)"))
    _randomize(m)
    y = m(torch.full((2, 3, D), 3.0))
    assert torch.equal(y, m.n.bias.detach().expand(2, 3, D))


def test_layernorm_statistics_in_the_declared_accumulation_dtype() -> None:
    x = _x(4, 6, D, scale=2.0, shift=1.0)
    exact = _layer_norm(x.double(), torch.ones(D, dtype=torch.float64), torch.zeros(D, dtype=torch.float64), 1e-5)
    f64 = _compile(_norm_block("layernorm(D, eps=1e-5, accum=f64)"))(x)
    f32 = _compile(_norm_block("layernorm(D, eps=1e-5, accum=f32)"))(x)
    bf16 = _compile(_norm_block("layernorm(D, eps=1e-5, accum=bf16)"))(x)
    assert f64.dtype == f32.dtype == bf16.dtype == torch.float32
    # f64 statistics: the exact value rounded once to f32 (within one f32 ulp)
    torch.testing.assert_close(f64.double(), exact, rtol=2**-23, atol=0)
    torch.testing.assert_close(f32.double(), exact, rtol=0, atol=4e-7)
    # bf16 statistics carry bf16 rounding (8 significant bits): visibly worse, still bf16-accurate
    err = (bf16.double() - exact).abs().max().item()
    assert 1e-3 < err < 2 ** -5 * exact.abs().max().item()


# ------------------------------------------------------------ RMSNorm


def _rms(xf: Tensor, eps: float) -> Tensor:
    """x / sqrt(mean(x^2) + eps), in the dtype of ``xf``."""
    return xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)


@pytest.mark.parametrize("cast", ["before_weight", "after_weight", "weight_dtype"])
@pytest.mark.parametrize("offset", [0, 1])
def test_rmsnorm_fp32_is_the_formula(cast: str, offset: int) -> None:
    m = _compile(_norm_block(f"rmsnorm(D, eps=0.1, offset={offset}, cast={cast})"))
    # offset=1 stores the deviation from one, so its initial scale is still one
    torch.testing.assert_close(m.n.weight + offset, torch.ones(D), rtol=0, atol=0)
    _randomize(m)
    x = _x(3, 5, D, shift=0.5)
    w = m.n.weight.detach().double()
    xd = x.double()
    want = (offset + w) * xd / torch.sqrt((xd**2).sum(-1, keepdim=True) / D + 0.1)
    torch.testing.assert_close(m(x).double(), want, rtol=1e-6, atol=1e-6)
    # not re-centred: shifting the row changes the output (LayerNorm would not)
    assert (m(x + 1.0) - m(x)).abs().max() > 1e-2


def _rms_bf16(x: Tensor, w: Tensor, eps: float, offset: int, cast: str) -> Tensor:
    """The paper's LlamaRMSNorm trace (before_weight) and its weight-first neighbour (after_weight)."""
    normalized = _rms(x.float(), eps)
    if cast == "before_weight":
        return (offset + w) * normalized.to(x.dtype)
    return (normalized * (offset + w.float())).to(x.dtype)


@pytest.mark.parametrize("cast", ["before_weight", "after_weight"])
@pytest.mark.parametrize("offset", [0, 1])
def test_rmsnorm_bf16_cast_order(cast: str, offset: int) -> None:
    m = _compile(_norm_block(f"rmsnorm(D, eps=1e-6, offset={offset}, cast={cast})"), dtype=torch.bfloat16)
    _randomize(m)
    w = m.n.weight.detach()
    x = _x(4, 6, D, scale=7.0, dtype=torch.bfloat16)
    y = m(x)
    assert y.dtype == torch.bfloat16
    assert torch.equal(y, _rms_bf16(x, w, 1e-6, offset, cast))
    other = "after_weight" if cast == "before_weight" else "before_weight"
    assert not torch.equal(y, _rms_bf16(x, w, 1e-6, offset, other))


def _t5_norm(x: Tensor, w: Tensor, eps: float) -> Tensor:
    """T5LayerNorm: f32 mean square; scale x in its promoted dtype; to the weight's dtype if half."""
    normalized = x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)
    if w.dtype in (torch.float16, torch.bfloat16):
        normalized = normalized.to(w.dtype)
    return w * normalized


@pytest.mark.parametrize("weight_dtype", [torch.float32, torch.bfloat16])
def test_rmsnorm_weight_dtype_follows_the_weight(weight_dtype: torch.dtype) -> None:
    m = _compile(_norm_block("rmsnorm(D, eps=1e-6, cast=weight_dtype)"), dtype=weight_dtype)
    _randomize(m)
    x = _x(4, 6, D, scale=7.0, dtype=torch.bfloat16)
    y = m(x)
    assert y.dtype == weight_dtype
    assert torch.equal(y, _t5_norm(x, m.n.weight.detach(), 1e-6))
    if weight_dtype == torch.float32:
        # with f32 weights T5 never rounds the normalized row to bf16; LLaMA's order does
        before = _compile(_norm_block("rmsnorm(D, eps=1e-6, cast=before_weight)"))
        before.load_state_dict(m.state_dict())
        assert not torch.equal(before(x), y)


# ------------------------------------------------------------ ScaleNorm and DyT


def test_scalenorm_is_one_scalar_over_the_l2_norm() -> None:
    m = _compile(_norm_block("scalenorm(D, eps=1e-5)"))
    assert m.n.scale.shape == () and m.n.scale.item() == pytest.approx(math.sqrt(D))
    x = _x(3, 5, D, shift=0.3)
    # at init g = sqrt(d): the same row RMS as RMSNorm without weights
    torch.testing.assert_close(m(x).pow(2).mean(-1), torch.ones(3, 5), rtol=1e-5, atol=1e-6)
    with torch.no_grad():
        m.n.scale.fill_(1.7)
    xd = x.double()
    torch.testing.assert_close(m(x).double(), 1.7 * xd / xd.norm(dim=-1, keepdim=True), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(m(3.0 * x), m(x), rtol=1e-6, atol=1e-6)  # positive rescaling invariance


def test_dyt_is_elementwise_tanh_with_its_derivative() -> None:
    m = _compile(_norm_block("dyt(D, alpha=0.5)"))
    x = _x(3, 5, D, scale=2.0).requires_grad_(True)
    assert m.n.alpha.item() == 0.5
    torch.testing.assert_close(m(x), torch.tanh(0.5 * x), rtol=0, atol=0)  # gamma=1, beta=0 at init
    _randomize(m)
    alpha, gamma, beta = m.n.alpha.detach(), m.n.weight.detach(), m.n.bias.detach()
    y = m(x)
    torch.testing.assert_close(y, gamma * torch.tanh(alpha * x) + beta, rtol=1e-6, atol=1e-6)
    cot = _x(3, 5, D, seed=1)
    (gx,) = torch.autograd.grad(y, x, cot)
    # dDyT/dx_i = gamma_i alpha (1 - tanh^2(alpha x_i)): no coupling across the row
    torch.testing.assert_close(gx, cot * gamma * alpha * (1 - torch.tanh(alpha * x.detach()) ** 2),
                               rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------ dropout


def _drop_block(call: str) -> str:
    # an identity linear makes the branch exactly x, so the dropped value shows the mask
    return ("block T(x: [B, S, D]) -> [B, S, D] {\n  lin: linear(D, D, bias=false)\n"
            f"  u = {call}\n  y = x + u\n  return y\n}}")


def _identity_linear(m: torch.nn.Module) -> None:
    with torch.no_grad():
        m.lin.weight.copy_(torch.eye(m.lin.weight.shape[0]))


def _dropped(call: str, shape: tuple[int, ...], *, train: bool = True, seed: int = 0,
             dims: dict[str, int] | None = None) -> tuple[Tensor, Tensor]:
    """(x, u) with u the dropout's output on a positive x, in train mode under torch.manual_seed(seed)."""
    m = _compile(_drop_block(call), dims=dims).train(train)
    _identity_linear(m)
    x = _x(*shape, seed=seed).abs() + 0.5
    torch.manual_seed(seed)
    with torch.no_grad():
        _, values = blockir.trace(m, x)
    return x, values["u"]


def test_dropout_is_inverted() -> None:
    x, u = _dropped("dropout(lin(x), p=0.25)", (4, 6, D))
    keep = u != 0
    assert 0 < keep.sum() < keep.numel()
    torch.testing.assert_close(u[keep], x[keep] / 0.75, rtol=1e-6, atol=0)


@pytest.mark.parametrize("call", ["dropout(lin(x), p=0.5)", "dropout(lin(x), p=0.5, mask=row)",
                                  "dropout(lin(x), p=0.5, mask=channel)", "drop_path(lin(x), p=0.5)"])
def test_dropout_is_identity_in_eval(call: str) -> None:
    x, u = _dropped(call, (4, 6, D), train=False)
    assert torch.equal(u, x)


MASK_SHAPES = {
    # declaration -> the axes one draw covers, as the mask shape of a [B, S, D] tensor
    "dropout(lin(x), p=0.5)": (64, 12, D),
    "dropout(lin(x), p=0.5, mask=element)": (64, 12, D),
    "dropout(lin(x), p=0.5, mask=row)": (64, 12, 1),
    "dropout(lin(x), p=0.5, mask=channel)": (64, 1, D),
    "drop_path(lin(x), p=0.5)": (64, 1, 1),
}


@pytest.mark.parametrize("call", list(MASK_SHAPES))
def test_dropout_mask_broadcast(call: str) -> None:
    x, u = _dropped(call, (64, 12, D))
    keep = u != 0
    shape = MASK_SHAPES[call]
    # one draw per mask entry: constant along every broadcast axis...
    reduced = keep
    for axis, size in enumerate(shape):
        if size == 1:
            assert (reduced == reduced.select(axis, 0).unsqueeze(axis)).all(), f"mask varies along axis {axis}"
            reduced = reduced.narrow(axis, 0, 1)
    # ...and independent across the drawn ones
    assert reduced.shape == shape
    assert 0.3 < reduced.float().mean() < 0.7
    torch.testing.assert_close(u[keep], 2 * x[keep], rtol=0, atol=0)
    assert (u[~keep] == 0).all()


def test_dropout_keep_rate_over_a_million_elements() -> None:
    p = 0.3
    _, u = _dropped(f"dropout(lin(x), p={p})", (10, 1000, 100), dims={"D": 100})
    assert u.numel() == 10**6
    rate = (u != 0).float().mean().item()
    assert abs(rate - (1 - p)) <= 0.01 * (1 - p)


TWO_SITES = """
block T(x: [B, S, D]) -> [B, S, D] {
  lin1: linear(D, D, bias=false)
  lin2: linear(D, D, bias=false)
  a = dropout(lin1(x), p=0.5)
  h = x + a
  c = dropout(lin2(h), p=0.5)
  y = h + c
  return y
}
model M(x: [B, S, D]) -> [B, S, D] {
  layers: T * 2
  return layers(x)
}
"""


def _two_site_masks(seed: int) -> dict[str, Tensor]:
    m = blockir.compile(blockir.parse(HEADER + TWO_SITES), "M", seed=0, dims={"D": 32}).train()
    with torch.no_grad():
        for layer in ("layers.0", "layers.1"):
            for lin in ("lin1", "lin2"):
                m.get_parameter(f"{layer}.{lin}.weight").copy_(torch.eye(32))
    x = _x(4, 16, 32).abs() + 0.5  # positive, so every branch value is non-zero before dropout
    torch.manual_seed(seed)
    with torch.no_grad():
        _, values = blockir.trace(m, x)
    return {k: values[k] != 0 for k in ("layers.0.a", "layers.0.c", "layers.1.a", "layers.1.c")}


def test_dropout_masks_differ_across_sites_and_layers() -> None:
    masks = _two_site_masks(0)
    names = list(masks)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            agree = (masks[a] == masks[b]).float().mean().item()
            # independent p=0.5 masks agree on about half of 2048 positions
            assert 0.4 < agree < 0.6, (a, b, agree)
    # the masks come from torch's generator: same seed, same masks; another seed, others
    again, other = _two_site_masks(0), _two_site_masks(1)
    assert all(torch.equal(masks[k], again[k]) for k in masks)
    assert not any(torch.equal(masks[k], other[k]) for k in masks)


CHECKPOINTED = """
block T(x: [B, S, D]) -> [B, S, D] {
  n1: layernorm(D)
  mlp1: mlp(F, act=gelu)
  n2: rmsnorm(D)
  mlp2: mlp(F, act=relu)
  h = x + dropout(mlp1(n1(x)), p=0.3, mask=row)
  y = h + dropout(mlp2(n2(h)), p=0.3)
  return y
}
model M(x: [B, S, D]) -> [B, S, D] {
  layers: T * 2
  norm: layernorm(D)
  return norm(layers(x))
}
"""


def _train_step(m: torch.nn.Module, x: Tensor, recompute: bool) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
    m.zero_grad(set_to_none=True)
    x = x.clone().requires_grad_(True)
    torch.manual_seed(1234)
    y = checkpoint(m, x, use_reentrant=False) if recompute else m(x)
    y.backward(_x(*y.shape, seed=9))
    return y.detach(), x.grad, {k: p.grad.clone() for k, p in m.named_parameters()}


def test_checkpoint_recompute_replays_the_masks() -> None:
    m = blockir.compile(blockir.parse(HEADER + CHECKPOINTED), "M", seed=0).train()
    x = _x(3, 7, D)
    y, gx, grads = _train_step(m, x, recompute=False)
    y_ck, gx_ck, grads_ck = _train_step(m, x, recompute=True)
    assert torch.equal(y_ck, y)
    assert torch.equal(gx_ck, gx)
    assert all(torch.equal(grads_ck[k], grads[k]) for k in grads)
    # dropout was active: the eval output is different
    with torch.no_grad():
        assert (m.eval()(x) - y).abs().max() > 1e-2


# ------------------------------------------------------------ residual scales


def test_constant_scale() -> None:
    body = ("block T(x: [B, S, D]) -> [B, S, D] {\n  const a = 2 ** -0.5\n  lin: linear(D, D)\n"
            "  y = x + a * lin(x)\n  return y\n}")
    m = _compile(body)
    x = _x(3, 5, D)
    with torch.no_grad():
        branch = F.linear(x, m.lin.weight, m.lin.bias)
        assert torch.equal(m(x), x + 2**-0.5 * branch)


REZERO = """
block T(x: [B, S, D]) -> [B, S, D] {
  mlp: mlp(F, act=gelu)
  g: scalar(init=0)
  y = x + g * mlp(x)
  return y
}
"""


def test_rezero_starts_as_the_identity_and_the_gate_gets_the_inner_product() -> None:
    m = _compile(REZERO)
    assert m.g.shape == () and m.g.item() == 0.0
    x = _x(3, 5, D).requires_grad_(True)
    cot = _x(3, 5, D, seed=1)
    y = m(x)
    assert torch.equal(y, x)
    y.backward(cot)
    # dy/dx = I at g = 0, and dL/dg = <dL/dy, F(x)>
    assert torch.equal(x.grad, cot)
    with torch.no_grad():
        branch = m.mlp(x)
    torch.testing.assert_close(m.g.grad, (cot * branch).sum(), rtol=1e-5, atol=1e-6)
    assert m.g.grad.abs() > 1e-3
    # the gate blocks the branch's own gradients until it opens
    assert all(torch.equal(p.grad, torch.zeros_like(p)) for k, p in m.named_parameters() if k.startswith("mlp."))
    with torch.no_grad():
        m.g.fill_(0.3)
        torch.testing.assert_close(m(x), x + 0.3 * branch, rtol=1e-6, atol=1e-6)


LAYERSCALE = """
block T(x: [B, S, D]) -> [B, S, D] {
  mlp: mlp(F, act=gelu)
  ls.gamma: vector(D, init=1e-5)
  y = x + ls.gamma * mlp(x)
  return y
}
"""


def test_layerscale_is_a_per_channel_gain() -> None:
    m = _compile(LAYERSCALE)
    gamma = m.get_parameter("ls.gamma")
    assert torch.equal(gamma, torch.full((D,), 1e-5))
    with torch.no_grad():
        gamma.copy_(_x(D, seed=3))
    x = _x(3, 5, D)
    cot = _x(3, 5, D, seed=1)
    y = m(x)
    y.backward(cot)
    with torch.no_grad():
        branch = m.mlp(x)
    torch.testing.assert_close(y, x + gamma * branch, rtol=1e-6, atol=1e-6)
    # one gradient per channel, summed over the rows that share it
    torch.testing.assert_close(gamma.grad, (cot * branch).sum((0, 1)), rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------ DeepNorm


DEEPNORM = ROOT / "examples" / "deepnorm.block"


@pytest.mark.parametrize("name, layers", [("DeepNormDecoder", 24), ("DeepNormLayer", 1)])
def test_deepnorm_alpha_is_the_decoder_only_constant(name: str, layers: int) -> None:
    m = blockir.compile(DEEPNORM, name, seed=0).eval()
    alpha = (2 * layers) ** 0.25
    with torch.no_grad():
        _, values = blockir.trace(m, _x(2, 5, 64))
    prefixes = [f"layers.{i}." for i in range(layers)] if layers > 1 else [""]
    for p in prefixes:
        # %0 = alpha * x and %3 = alpha * h in the printed IR
        assert torch.equal(values[p + "%0"], alpha * values[p + "x"]), p
        assert torch.equal(values[p + "%3"], alpha * values[p + "h"]), p
        torch.testing.assert_close(values[p + "%0"] / values[p + "x"],
                                   torch.full_like(values[p + "x"], alpha), rtol=1e-6, atol=0)


def _xavier_std(w: Tensor, gain: float) -> float:
    fan_out, fan_in = w.shape
    return gain * math.sqrt(2.0 / (fan_in + fan_out))


def test_deepnorm_beta_scales_value_output_and_mlp_but_not_query_key() -> None:
    layers = 24
    m = blockir.compile(DEEPNORM, "DeepNormDecoder", seed=0)
    beta = (8 * layers) ** -0.25
    gains = {"self_attn.q_proj": 1.0, "self_attn.k_proj": 1.0, "self_attn.v_proj": beta,
             "self_attn.o_proj": beta, "mlp.fc1": beta, "mlp.fc2": beta}
    for name, gain in gains.items():
        ws = [m.get_parameter(f"layers.{i}.{name}.weight").detach() for i in range(layers)]
        pooled = torch.cat([w.flatten() for w in ws])
        # std of a std estimate from n >= 98k normal draws is ~1/sqrt(2n) < 0.25%; allow 3%
        assert pooled.std().item() == pytest.approx(_xavier_std(ws[0], gain), rel=0.03), name
        assert pooled.mean().abs().item() < 0.05 * _xavier_std(ws[0], gain), name


# ------------------------------------------------------------ casts and the residual dtype


def test_cast_gives_the_declared_dtype() -> None:
    m = _compile("block T(x: [B, S, D] bf16) -> [B, S, D] f32 {\n  y = cast(x, f32)\n  return y\n}")
    x = _x(2, 3, D, dtype=torch.bfloat16)
    y = m(x)
    assert y.dtype == torch.float32 and torch.equal(y, x.float())


def test_fp32_residual_with_a_bf16_activation_branch() -> None:
    m = _compile("block T(x: [B, S, D] f32) -> [B, S, D] f32 {\n  u = gelu(cast(x, bf16))\n"
                 "  y = x + cast(u, f32)\n  return y\n}")
    x = _x(2, 3, D, scale=3.0)
    y, values = blockir.trace(m, x)
    assert values["u"].dtype == torch.bfloat16
    assert torch.equal(values["u"], F.gelu(x.bfloat16()))
    # the residual add is f32: x keeps its low bits, only the branch was rounded
    assert y.dtype == torch.float32
    assert torch.equal(y, x + F.gelu(x.bfloat16()).float())
    assert not torch.equal(y, x + F.gelu(x))


MIXED = """
block T(x: [B, S, D] f32) -> [B, S, D] f32 {
  norm: rmsnorm(D, eps=1e-6)
  mlp: mlp(F, act=gelu)
  b = cast(x, bf16)
  u = mlp(norm(b))
  y = x + cast(u, f32)
  return y
}
"""


def test_fp32_residual_with_a_bf16_branch_keeps_the_ir_dtypes() -> None:
    """A branch fed cast(x, bf16) is typed bf16 in the IR; its runtime values must be bf16 too."""
    program = blockir.parse(HEADER + MIXED)
    m = blockir.compile(program, "T", seed=0)
    x = _x(2, 3, D, scale=3.0)
    y, values = blockir.trace(m, x)
    block = program.block("T")
    dtypes = {"f32": torch.float32, "bf16": torch.bfloat16}
    assert {k: v.dtype for k, v in values.items()} == {k: dtypes[block.type_of(k).dtype.value] for k in values}
    assert torch.equal(y, x + values["u"].float())


# ------------------------------------------------------------ finite differences in float64


GRADCHECK = {
    # statistics in f64 too: the default f32 accumulation would be below gradcheck's resolution
    "layernorm": "n: layernorm(D, eps=1e-5, accum=f64)\n  y = x + lin(n(x))",
    "rmsnorm_before_weight": "n: rmsnorm(D, eps=1e-6, cast=before_weight, accum=f64)\n  y = x + lin(n(x))",
    "rmsnorm_after_weight_offset": "n: rmsnorm(D, eps=1e-6, offset=1, cast=after_weight, accum=f64)\n"
                                   "  y = x + lin(n(x))",
    "rmsnorm_weight_dtype": "n: rmsnorm(D, eps=1e-6, cast=weight_dtype, accum=f64)\n  y = x + lin(n(x))",
    "scalenorm": "n: scalenorm(D, eps=1e-5)\n  y = x + lin(n(x))",
    "dyt": "n: dyt(D, alpha=0.5)\n  y = x + lin(n(x))",
    "constant_scale": "y = x + 0.5 * lin(x)",
    "scalar": "g: scalar(init=0)\n  y = x + g * lin(x)",
    "vector": "g.gamma: vector(D, init=1e-5)\n  y = x + g.gamma * lin(x)",
}


@pytest.mark.parametrize("case", list(GRADCHECK))
def test_gradcheck_float64(case: str) -> None:
    body = f"block T(x: [B, S, D]) -> [B, S, D] {{\n  lin: linear(D, D)\n  {GRADCHECK[case]}\n  return y\n}}"
    m = _compile(body, dims={"D": 4}, dtype=torch.float64).eval()
    _randomize(m)
    names = [k for k, _ in m.named_parameters()]
    params = tuple(p.detach().clone().requires_grad_(True) for _, p in m.named_parameters())
    x = _x(2, 3, 4, dtype=torch.float64).requires_grad_(True)

    def f(x: Tensor, *ps: Tensor) -> Tensor:
        return torch.func.functional_call(m, dict(zip(names, ps)), (x,))

    assert torch.autograd.gradcheck(f, (x, *params), eps=1e-6, atol=1e-6, rtol=1e-5)
