"""Property tests: transforms keep the function. Random residual blocks (norm family and placement,
dropout, scales) compile to the same numbers with backend="fused" as with "fx", and folding in
float64 inference changes nothing."""
from __future__ import annotations

import copy

import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import blockir
from blockir.lower.fold import apply_folds

HEAD = """dim B: batch
dim S: seq
dim D: model = 16
dim F: hidden = 32
dim H: heads = 2
"""

NORMS = st.sampled_from([
    "layernorm(D, eps=1e-5)", "layernorm(D, eps=1e-6, bias=false)",
    "rmsnorm(D, eps=1e-6)", "rmsnorm(D, eps=1e-6, offset=1, cast=after_weight)",
    "rmsnorm(D, eps=1e-5, cast=weight_dtype)",
])
BRANCHES = st.sampled_from(["mlp(F, act=gelu)", "gated_mlp(F, act=silu)", "self_attention(heads=H)", "linear(D, D)",
                            "self_attention(heads=H, head_scale=true, init_scale=0.5)",
                            "mlp(F, act=relu, init_std=fan_in, init_zero=true)"])


@st.composite
def sublayer(draw: st.DrawFn, i: int, placement: str, with_dropout: bool) -> tuple[list[str], str]:
    """Declarations and the equation of one residual update of the state ``s{i}`` into ``s{i+1}``."""
    decls = [f"  f{i}: {draw(BRANCHES)}"]
    x = f"s{i}"
    arg = x
    if placement in ("pre", "peri"):
        decls.append(f"  n{i}: {draw(NORMS)}")
        arg = f"n{i}({x})"
    update = f"f{i}({arg})"
    if placement == "peri":
        decls.append(f"  o{i}: {draw(NORMS)}")
        update = f"o{i}({update})"
    if with_dropout and draw(st.booleans()):
        mask = draw(st.sampled_from(["", ", mask=row"]))
        update = f"dropout({update}, p=0.25{mask})"
    scale = draw(st.sampled_from(["none", "const", "scalar", "vector", "step"]))
    if scale == "step":  # nGPT-style: move the state toward the branch by a learned step
        decls.append(f"  g{i}: vector(D, init=0.3)")
        update = f"g{i} * ({update} - {x})"
    elif scale == "const":
        update = f"0.5 * {update}"
    elif scale in ("scalar", "vector"):
        decls.append(f"  g{i}: {'scalar(init=0.7)' if scale == 'scalar' else 'vector(D, init=0.3)'}")
        update = f"g{i} * {update}"
    shortcut = f"1.5 * {x}" if draw(st.booleans()) and placement == "post" else x
    total = f"{shortcut} + {update}"
    if placement == "post":
        decls.append(f"  p{i}: {draw(NORMS)}")
        total = f"p{i}({total})"
    return decls, f"  s{i + 1} = {total}"


@st.composite
def programs(draw: st.DrawFn, with_dropout: bool = True) -> str:
    n = draw(st.integers(1, 3))
    # one placement per block: after a Post-LN update the stream is a normalized value, and the
    # verifiers reject an update that then treats it as an unnormalized residual
    placement = draw(st.sampled_from(["pre", "post", "peri", "none"]))
    decls, eqs = [], []
    for i in range(n):
        d, e = draw(sublayer(i, placement, with_dropout))
        decls += d
        eqs.append(e)
    final = draw(st.sampled_from(["", "rmsnorm(D, eps=1e-6)", "layernorm(D)"]))
    ret = f"s{n}"
    if final:
        decls.append(f"  final: {final}")
        ret = f"final(s{n})"
    body = "\n".join(decls + eqs + [f"  return {ret}"])
    return HEAD + "block L(s0: [B, S, D]) -> [B, S, D] {\n" + body + "\n}\n"


def _grads(m: torch.nn.Module, x: torch.Tensor, seed: int) -> tuple[torch.Tensor, ...]:
    x = x.clone().requires_grad_()
    torch.manual_seed(seed)
    y = m(x)
    (y * torch.linspace(-1, 1, y.shape[-1], dtype=y.dtype)).sum().backward()
    return (y.detach(), x.grad, *(p.grad for _, p in sorted(m.named_parameters())))


@settings(max_examples=100, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(text=programs())
def test_fused_backend_equals_fx(text: str) -> None:
    program = blockir.parse(text, "random.block")
    assert [d for d in blockir.verify(program) if d.is_error] == []
    # fp32: the fused kernels take fp32 statistics, and their analytic backward sums in another
    # order than autograd, so gradients agree to fp32 rounding relative to each tensor's scale
    fx = blockir.compile(program, "L", seed=0).train()
    fused = blockir.compile(program, "L", "fused", seed=0).train()
    fused.load_state_dict(copy.deepcopy(fx.state_dict()), strict=True)
    x = torch.randn(2, 3, 16, generator=torch.Generator().manual_seed(1))
    y_fused, *g_fused = _grads(fused, x, seed=5)
    y_fx, *g_fx = _grads(fx, x, seed=5)
    torch.testing.assert_close(y_fused, y_fx, rtol=1e-6, atol=1e-6)
    for a, b in zip(g_fused, g_fx):
        if b is None:
            assert a is None
            continue
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5 * (1e-3 + b.abs().max().item()))


def _carried(text: str) -> str:
    """The block as the layer of a 2-deep stack with a carried stream ``c`` of the state's type, which
    each layer updates as its own residual stream (``c + fc(c)``); the model starts it at zeros and
    normalizes the sum of the state and the stream's last value."""
    head, body = text.split("block L(s0: [B, S, D]) -> [B, S, D] {\n")
    body, ret = body.rsplit("  return ", 1)
    ret = ret.split("\n")[0]
    return (head + "block L(s0: [B, S, D], c: [B, S, D]) -> ([B, S, D], [B, S, D]) {\n  fc: linear(D, D)\n"
            + body + f"  return {ret}, c + fc(c)\n}}\n"
            + "model M(x: [B, S, D]) -> [B, S, D] {\n  layers: L * 2\n  mix: layernorm(D)\n"
            + "  c0 = zeros([B, S, D])\n  y, c_last = layers(x, c0)\n  return mix(y + 0.5 * c_last)\n}\n")


@settings(max_examples=10, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(text=programs(with_dropout=False))
def test_fused_backend_equals_fx_through_a_carried_stream(text: str) -> None:
    assume("  p0:" not in text)
    program = blockir.parse(_carried(text), "random.block")
    errors = {d.code for d in blockir.verify(program) if d.is_error}
    if "  return s" in text:
        assert errors == set()
    else:
        # a layer returning a norm's output hands it to the next layer; where that layer continues it un-normalized
        # the verifier finds it through the stack (E0412), as in the stack written out flat
        assert errors <= {"E0412"}
        assume(not errors)
    fx = blockir.compile(program, "M", seed=0).train()
    fused = blockir.compile(program, "M", "fused", seed=0).train()
    fused.load_state_dict(copy.deepcopy(fx.state_dict()), strict=True)
    x = torch.randn(2, 3, 16, generator=torch.Generator().manual_seed(1))
    y_fused, *g_fused = _grads(fused, x, seed=5)
    y_fx, *g_fx = _grads(fx, x, seed=5)
    torch.testing.assert_close(y_fused, y_fx, rtol=1e-6, atol=1e-6)
    for a, b in zip(g_fused, g_fx):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5 * (1e-3 + b.abs().max().item()))


@settings(max_examples=100, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(text=programs())
def test_folding_keeps_the_inference_function(text: str) -> None:
    # f64 statistics: with the default f32 statistics the unfolded graph rounds its own affine in f32
    text = text.replace("layernorm(D", "layernorm(D, accum=f64").replace("rmsnorm(D", "rmsnorm(D, accum=f64")
    program = blockir.parse(text, "random.block")
    module = blockir.compile(program, "L", seed=0, dtype=torch.float64).eval()
    with torch.no_grad():
        for p in module.parameters():  # move every norm weight and scale away from its init
            p.add_(0.2 * torch.randn(p.shape, dtype=p.dtype, generator=torch.Generator().manual_seed(p.numel())))
    result = apply_folds(program, "L", module)
    x = torch.randn(2, 3, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        before, after = module(x), result.module.eval()(x)
    torch.testing.assert_close(after, before, rtol=1e-10, atol=1e-10 * before.abs().max().item())
