"""Norms, dropout and activations against written-out formulas and the real reference classes."""
from __future__ import annotations

import math
from functools import partial

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from transformers.activations import ACT2FN
from transformers.models.gemma2.modeling_gemma2 import Gemma2RMSNorm
from transformers.models.llama.modeling_llama import LlamaRMSNorm
from transformers.models.olmo2.modeling_olmo2 import Olmo2RMSNorm
from transformers.models.t5.modeling_t5 import T5LayerNorm

from blockir.lower.layers.norm_module import make_norm
from blockir.lower.layers.numerics import ACTIVATIONS, dropout, dropout_mask_shape
from blockir.norms.base import accum_dtype
from blockir.norms.dyt import dyt
from blockir.norms.layernorm import layer_norm
from blockir.norms.rmsnorm import rms_norm
from blockir.norms.scalenorm import scale_norm
from blockir.lower.layers.attention_core import ALL_HEADS, drop_probs, recording_dropout
from blockir.lower.layers.query_rows import QueryRows
from blockir.lower.layers.zigzag import zigzag_order, zigzag_runs
from blockir.lower.rng import dropout_key, keep_block, keep_mask

D = 64
LayerNorm, RMSNorm, ScaleNorm = (partial(make_norm, name) for name in ("layernorm", "rmsnorm", "scalenorm"))


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _x(*shape: int, dtype: torch.dtype = torch.float32, seed: int = 0, mean: float = 0.0) -> torch.Tensor:
    return (torch.randn(*shape, generator=_gen(seed), dtype=torch.float64) * 3 + mean).to(dtype)


def _vec(seed: int, dtype: torch.dtype = torch.float32, width: int = D) -> torch.Tensor:
    return (1 + 0.5 * torch.randn(width, generator=_gen(seed), dtype=torch.float64)).to(dtype)


# ---------------------------------------------------------------- formulas


def _layer_norm_formula(x, w, b, eps):
    mean = x.sum(-1, keepdim=True) / x.shape[-1]
    var = ((x - mean) ** 2).sum(-1, keepdim=True) / x.shape[-1]
    return (x - mean) / torch.sqrt(var + eps) * w + b


def _rms_formula(x, w, eps):
    return w * x / torch.sqrt((x**2).sum(-1, keepdim=True) / x.shape[-1] + eps)


def test_accum_names() -> None:
    assert {n: accum_dtype(n) for n in ("f32", "f64", "bf16", "f16")} == \
        {"f32": torch.float32, "f64": torch.float64, "bf16": torch.bfloat16, "f16": torch.float16}


# ---------------------------------------------------------------- LayerNorm


@pytest.mark.parametrize("accum", [torch.float32, torch.float64])
def test_layer_norm_matches_formula(accum: torch.dtype) -> None:
    x, w, b = _x(3, 5, D, mean=2.0), _vec(1), _vec(2)
    ref = _layer_norm_formula(x.double(), w.double(), b.double(), 1e-5)
    out = layer_norm(x, w, b, 1e-5, accum)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.double(), ref, rtol=1e-6, atol=1e-6)


def test_layer_norm_f64_accum_in_float64_is_the_formula() -> None:
    x, w, b = _x(4, D, dtype=torch.float64), _vec(1, torch.float64), _vec(2, torch.float64)
    expected = _layer_norm_formula(x, w, b, 1e-5)
    torch.testing.assert_close(layer_norm(x, w, b, 1e-5, torch.float64), expected, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_layer_norm_is_bitwise_nn_layer_norm(dtype: torch.dtype) -> None:
    ref = nn.LayerNorm(D, eps=1e-5).to(dtype)
    with torch.no_grad():
        ref.weight.copy_(_vec(1))
        ref.bias.copy_(_vec(2))
    ours = LayerNorm(D, eps=1e-5).to(dtype)
    ours.load_state_dict(ref.state_dict(), strict=True)
    x = _x(2, 7, D, dtype=dtype, mean=1.0)
    assert torch.equal(ours(x), ref(x))


@pytest.mark.parametrize(
    ("kwargs", "ref_kwargs"),
    [({"bias": False}, {"bias": False}), ({"affine": False}, {"elementwise_affine": False})],
)
def test_layer_norm_variants_load_and_match(kwargs: dict, ref_kwargs: dict) -> None:
    ref = nn.LayerNorm(D, **ref_kwargs)
    ours = LayerNorm(D, **kwargs)
    assert ours.state_dict().keys() == ref.state_dict().keys()
    ours.load_state_dict(ref.state_dict(), strict=True)
    x = _x(3, D)
    assert torch.equal(ours(x), ref(x))


def test_layer_norm_explicit_accum_differs_from_kernel_only_by_rounding() -> None:
    x = _x(8, D, dtype=torch.bfloat16, mean=4.0)
    fp32 = layer_norm(x, None, None, 1e-5)
    fp64 = layer_norm(x, None, None, 1e-5, accum=torch.float64)
    assert fp64.dtype == torch.bfloat16
    # both round the same exact value to bf16, so they may differ by at most one bf16 ulp
    assert ((fp32.float() - fp64.float()).abs() <= fp32.float().abs() * 2**-7 + 1e-6).all()


# ---------------------------------------------------------------- RMSNorm

# (reference class, cast order, offset)
HF_RMS = [
    (LlamaRMSNorm, "before_weight", 0),
    (Gemma2RMSNorm, "after_weight", 1),
    (Olmo2RMSNorm, "after_weight", 0),
    (T5LayerNorm, "weight_dtype", 0),
]


def _hf_rms(cls: type[nn.Module], weight: torch.Tensor, eps: float) -> nn.Module:
    ref = cls(D, eps=eps)
    ref.weight = nn.Parameter(weight.clone())
    return ref


@pytest.mark.parametrize(("cls", "cast", "offset"), HF_RMS, ids=[c[0].__name__ for c in HF_RMS])
@pytest.mark.parametrize(
    ("x_dtype", "w_dtype"),
    [
        (torch.float32, torch.float32),
        (torch.bfloat16, torch.bfloat16),
        (torch.bfloat16, torch.float32),
        (torch.float16, torch.float16),
    ],
)
def test_rms_norm_is_bitwise_hf(
    cls: type[nn.Module], cast: str, offset: int, x_dtype: torch.dtype, w_dtype: torch.dtype
) -> None:
    weight = _vec(3, w_dtype) - offset
    ref = _hf_rms(cls, weight, 1e-6)
    ours = RMSNorm(D, eps=1e-6, offset=offset, cast=cast).to(w_dtype)
    ours.load_state_dict(ref.state_dict(), strict=True)
    x = _x(2, 5, D, dtype=x_dtype, mean=0.5)
    expected = ref(x)
    got = ours(x)
    assert got.dtype == expected.dtype
    assert torch.equal(got, expected)


@pytest.mark.parametrize("cast", ["before_weight", "after_weight", "weight_dtype"])
@pytest.mark.parametrize("offset", [0, 1])
def test_rms_norm_matches_formula(cast: str, offset: int) -> None:
    x, w = _x(3, D, mean=1.0), _vec(4)
    ref = _rms_formula(x.double(), w.double() + offset, 1e-6)
    torch.testing.assert_close(rms_norm(x, w, 1e-6, offset, cast).double(), ref, rtol=1e-6, atol=1e-6)


def test_rms_norm_cast_orders_are_observably_different_in_bf16() -> None:
    x, w = _x(16, D, dtype=torch.bfloat16), _vec(5, torch.bfloat16)
    before = rms_norm(x, w, 1e-6, cast="before_weight")
    after = rms_norm(x, w, 1e-6, cast="after_weight")
    assert before.dtype == after.dtype == torch.bfloat16
    assert not torch.equal(before, after)


def test_rms_norm_init_and_unknown_cast() -> None:
    assert torch.equal(RMSNorm(D).weight, torch.ones(D))
    assert torch.equal(RMSNorm(D, offset=1).weight, torch.zeros(D))
    x = _x(2, D)
    torch.testing.assert_close(RMSNorm(D, offset=1, cast="after_weight")(x), RMSNorm(D)(x))
    with pytest.raises(ValueError, match="cast order"):
        RMSNorm(D, cast="sideways")
    with pytest.raises(ValueError, match="cast order"):
        rms_norm(x, torch.ones(D), 1e-6, cast="sideways")


def test_rms_norm_is_not_recentering() -> None:
    x = _x(4, D)
    shifted = x + 3.0
    w = torch.ones(D)
    torch.testing.assert_close(rms_norm(2.5 * x, w, 0.0), rms_norm(x, w, 0.0))
    assert not torch.allclose(rms_norm(shifted, w, 1e-6), rms_norm(x, w, 1e-6), atol=1e-2)
    ln_shifted, ln = layer_norm(shifted, None, None, 1e-6), layer_norm(x, None, None, 1e-6)
    torch.testing.assert_close(ln_shifted, ln, atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------- ScaleNorm and DyT


def test_scale_norm_matches_formula_and_init() -> None:
    m = ScaleNorm(D, eps=1e-5)
    assert m.scale.shape == () and m.scale.item() == pytest.approx(math.sqrt(D))
    x = _x(3, 4, D)
    ref = m.scale.double() * x.double() / torch.sqrt((x.double() ** 2).sum(-1, keepdim=True)).clamp_min(1e-5)
    torch.testing.assert_close(m(x).double(), ref, rtol=1e-6, atol=1e-6)
    # sqrt(d) init gives unit RMS rows, the same scale an RMSNorm output starts at
    torch.testing.assert_close(m(x).pow(2).mean(-1), torch.ones(3, 4), rtol=1e-5, atol=1e-5)
    assert torch.equal(m(torch.zeros(2, D)), torch.zeros(2, D))


def test_dyt_matches_formula_and_init() -> None:
    m = make_norm("dyt", D, alpha=0.8)
    assert m.alpha.shape == (1,) and m.alpha.item() == pytest.approx(0.8)
    assert torch.equal(m.weight, torch.ones(D)) and torch.equal(m.bias, torch.zeros(D))
    with torch.no_grad():
        m.weight.copy_(_vec(6))
        m.bias.copy_(_vec(7))
    x = _x(2, 3, D)
    ref = m.weight * torch.tanh(m.alpha * x) + m.bias
    torch.testing.assert_close(m(x), ref, rtol=0, atol=0)
    # elementwise: changing one coordinate leaves the rest of the row alone
    y = x.clone()
    y[..., 0] += 10
    assert torch.equal(m(y)[..., 1:], m(x)[..., 1:])


# ---------------------------------------------------------------- gradients


def _d(*shape: int, seed: int = 0, mean: float = 0.0) -> torch.Tensor:
    return _x(*shape, dtype=torch.float64, seed=seed, mean=mean).requires_grad_()


def _dvec(seed: int, width: int = 6) -> torch.Tensor:
    return _vec(seed, torch.float64, width).requires_grad_()


def test_gradcheck_layer_norm() -> None:
    fn = lambda x, w, b: layer_norm(x, w, b, 1e-5, accum=torch.float64)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (_d(2, 3, 6, mean=1.0), _dvec(1), _dvec(2)))


@pytest.mark.parametrize("cast", ["before_weight", "after_weight", "weight_dtype"])
@pytest.mark.parametrize("offset", [0, 1])
def test_gradcheck_rms_norm(cast: str, offset: int) -> None:
    fn = lambda x, w: rms_norm(x, w, 1e-6, offset, cast, accum=torch.float64)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (_d(2, 3, 6, mean=0.5), _dvec(3)))


def test_gradcheck_scale_norm_and_dyt() -> None:
    scale = torch.tensor(2.5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, g: scale_norm(x, g, 1e-5), (_d(2, 3, 6), scale))
    alpha = torch.tensor([0.7], dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(dyt, (_d(2, 3, 6, seed=1) / 3, alpha, _dvec(4), _dvec(5)))


@pytest.mark.parametrize("broadcast", ["element", "row", "channel", "sample"])
def test_gradcheck_dropout(broadcast: str) -> None:
    fn = lambda x: dropout(x, 0.3, broadcast, True, key=1234)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (_d(3, 4, 6),))


# ---------------------------------------------------------------- edge rows


@pytest.mark.parametrize("accum", [torch.float32, torch.float64])
def test_constant_row_layer_norm_returns_bias(accum: torch.dtype) -> None:
    x = torch.full((3, D), 7.25)
    w, b = _vec(1), _vec(2)
    torch.testing.assert_close(layer_norm(x, w, b, 1e-5, accum), b.expand(3, D), rtol=0, atol=1e-6)


@pytest.mark.parametrize("accum", [torch.float32, torch.float64])
def test_width_one(accum: torch.dtype) -> None:
    x = torch.tensor([[3.0], [-2.0], [1e-3]])
    w, b = torch.tensor([1.5]), torch.tensor([0.25])
    # one coordinate is its own mean: nothing about the input survives LayerNorm
    torch.testing.assert_close(layer_norm(x, w, b, 1e-5, accum), torch.full((3, 1), 0.25))
    # RMSNorm keeps the sign: x / sqrt(x^2 + eps)
    expected = w * x / torch.sqrt(x**2 + 1e-6)
    torch.testing.assert_close(rms_norm(x, w, 1e-6, accum=accum), expected)
    torch.testing.assert_close(scale_norm(x, torch.tensor(2.0), 1e-5), 2.0 * torch.sign(x))


@pytest.mark.parametrize("magnitude", [1e18, 1e-20])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_extreme_magnitudes_stay_finite(magnitude: float, dtype: torch.dtype) -> None:
    unit = torch.randn(4, D, generator=_gen(0))
    x = (unit * magnitude).to(dtype)
    w, b = _vec(1), _vec(2)
    outs = [
        layer_norm(x, w, b, 1e-5),
        layer_norm(x, w, b, 1e-5, accum=torch.float64),
        *(rms_norm(x, w, 1e-6, cast=c) for c in ("before_weight", "after_weight", "weight_dtype")),
        scale_norm(x, torch.tensor(8.0), 1e-5),
        dyt(x, torch.tensor([0.5]), w, b),
    ]
    for out in outs:
        assert torch.isfinite(out).all()


def test_huge_rows_are_normalized_not_just_finite() -> None:
    # 1e18 keeps the fp32 sum of squares (~d * 1e36) below the fp32 maximum
    unit = torch.randn(4, D, generator=_gen(0))
    w = torch.ones(D)
    for accum in (torch.float32, torch.float64):
        huge = layer_norm(unit * 1e18, None, None, 1e-5, accum)
        torch.testing.assert_close(huge, layer_norm(unit, None, None, 0.0, accum), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(rms_norm(unit * 1e18, w, 1e-6), rms_norm(unit, w, 0.0), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(scale_norm(unit * 1e18, torch.tensor(1.0), 1e-5), F.normalize(unit, dim=-1))


def test_tiny_rows_are_dominated_by_eps() -> None:
    # at |x| ~ 1e-20 the variance is far below eps, so the output is ~ x / sqrt(eps), near zero
    x = torch.randn(4, D, generator=_gen(0)) * 1e-20
    expected = (x - x.mean(-1, keepdim=True)) / math.sqrt(1e-5)
    torch.testing.assert_close(layer_norm(x, None, None, 1e-5), expected, rtol=1e-4, atol=0)
    assert layer_norm(x, None, None, 1e-5).abs().max() < 1e-16


def test_eps_is_measurable_near_its_own_scale() -> None:
    # alternating +-a gives variance a^2 = 1e-5, the same size as the default eps
    row = torch.tensor([1.0, -1.0] * (D // 2)) * math.sqrt(1e-5)
    loose = layer_norm(row, None, None, 1e-5)
    tight = layer_norm(row, None, None, 1e-12)
    torch.testing.assert_close(tight.abs(), torch.ones(D), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(loose.abs(), torch.full((D,), 1 / math.sqrt(2)), rtol=1e-4, atol=1e-4)
    rms_loose = rms_norm(row, torch.ones(D), 1e-5)
    rms_tight = rms_norm(row, torch.ones(D), 1e-12)
    assert (rms_tight.abs() - rms_loose.abs()).min() > 0.25


# ---------------------------------------------------------------- dropout


def test_dropout_mask_shapes() -> None:
    shape = (2, 5, 8)
    assert dropout_mask_shape(shape, "element") == (2, 5, 8)
    assert dropout_mask_shape(shape, "row") == (2, 5, 1)
    assert dropout_mask_shape(shape, "channel") == (2, 1, 8)
    assert dropout_mask_shape(shape, "sample") == (2, 1, 1)
    with pytest.raises(ValueError, match="broadcast"):
        dropout_mask_shape(shape, "token")


@pytest.mark.parametrize("broadcast", ["element", "row", "channel", "sample"])
def test_dropout_broadcast_structure(broadcast: str) -> None:
    p = 0.4
    x = torch.ones(16, 12, 10)
    y = dropout(x, p, broadcast, True, key=dropout_key(7, 3, 1))
    scale = 1 / (1 - p)
    assert torch.equal(y.unique(), torch.tensor([0.0, scale]))
    mask_shape = dropout_mask_shape(tuple(x.shape), broadcast)
    # each broadcast axis carries one value per mask entry
    for axis, size in enumerate(mask_shape):
        if size == 1:
            assert torch.equal(y, y.narrow(axis, 0, 1).expand_as(y))
    rows = math.prod(mask_shape[:-1])
    keep = keep_mask(dropout_key(7, 3, 1), p, rows, mask_shape[-1]).reshape(mask_shape)
    assert torch.equal(y, (keep * scale).expand_as(y))


@pytest.mark.parametrize("p", [0.1, 0.5])
def test_dropout_keep_rate_and_mean_over_a_million(p: float) -> None:
    x = torch.ones(1000, 1000)
    y = dropout(x, p, "element", True, key=dropout_key(0, 0, 0))
    keep_rate = (y != 0).double().mean().item()
    assert abs(keep_rate - (1 - p)) < 0.01 * (1 - p)
    assert abs(y.double().mean().item() - 1.0) < 5e-3


def test_dropout_keys_identity_and_replay() -> None:
    x = _x(4, 8, 32)
    a = dropout(x, 0.25, "element", True, key=dropout_key(11, 0, 0))
    b = dropout(x, 0.25, "element", True, key=dropout_key(11, 0, 0))
    assert torch.equal(a, b)
    for other in (dropout_key(12, 0, 0), dropout_key(11, 1, 0), dropout_key(11, 0, 1)):
        assert not torch.equal((a == 0), (dropout(x, 0.25, "element", True, key=other) == 0))
    assert dropout(x, 0.25, "element", False, key=None) is x
    assert dropout(x, 0.0, "row", True, key=None) is x
    tensor_key = dropout_key(torch.tensor(11, dtype=torch.int64), 0, 0)
    assert torch.equal(dropout(x, 0.25, "element", True, key=tensor_key), a)


def test_dropout_scales_in_fp32_for_half_inputs() -> None:
    x = _x(64, 64).bfloat16()
    y = dropout(x, 0.1, "element", True, key=5)
    kept = y != 0
    assert torch.equal(y[kept], (x.float() * (1 / 0.9)).bfloat16()[kept])


def test_dropout_compiles_fullgraph_with_tensor_key() -> None:
    def step(x: torch.Tensor, seed: torch.Tensor) -> torch.Tensor:
        return dropout(x, 0.3, "row", True, key=dropout_key(seed, 2, 1)) * 2

    # aot_eager traces the same full graph as inductor (no .item(), no graph break)
    # without paying for a cold C++ compile in the test suite
    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    x = _x(3, 5, 16)
    for seed in (0, 2**40 + 3):
        key = torch.tensor(seed, dtype=torch.int64)
        assert torch.equal(compiled(x, key), step(x, key))


# ---------------------------------------------------------------- activations


@pytest.mark.parametrize(
    ("name", "hf_name"),
    [("relu", "relu"), ("gelu", "gelu"), ("gelu_tanh", "gelu_pytorch_tanh"), ("silu", "silu"), ("tanh", "tanh")],
)
def test_activations_match_hf(name: str, hf_name: str) -> None:
    x = _x(4, 33)
    assert torch.equal(ACTIVATIONS[name](x), ACT2FN[hf_name](x))


def test_activation_formulas() -> None:
    x = _x(4, 33, dtype=torch.float64)
    from blockir.ir.kinds import ACTIVATIONS as NAMES, GATES

    assert set(ACTIVATIONS) == {*NAMES, *GATES}  # every name the language accepts lowers
    torch.testing.assert_close(ACTIVATIONS["sigmoid"](x), 1 / (1 + torch.exp(-x)))
    torch.testing.assert_close(ACTIVATIONS["erf"](x), torch.special.erf(x))
    torch.testing.assert_close(ACTIVATIONS["gelu"](x), 0.5 * x * (1 + torch.erf(x / math.sqrt(2))))
    tanh_gelu = 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    torch.testing.assert_close(ACTIVATIONS["gelu_tanh"](x), tanh_gelu)
    torch.testing.assert_close(ACTIVATIONS["gelu_new"](x), tanh_gelu)
    torch.testing.assert_close(ACTIVATIONS["silu"](x), x * torch.sigmoid(x))
    assert ACTIVATIONS["identity"](x) is x
    assert not torch.equal(ACTIVATIONS["gelu"](x), ACTIVATIONS["gelu_tanh"](x))
    assert F.relu is ACTIVATIONS["relu"]


@pytest.mark.parametrize("start,size", [((0, 4, 0), (2, 4, 16)), ((0, 0, 8), (2, 8, 8)), ((1, 3, 5), (1, 2, 7))])
def test_a_block_of_the_keep_mask_is_that_slice_of_the_whole_mask(start: tuple[int, ...], size: tuple[int, ...]) -> None:
    """A rank holding rows (sequence parallel) or features (hidden sharding) draws the unsharded decisions."""
    shape = (2, 8, 16)
    whole = keep_mask(dropout_key(11, 1, 2), 0.3, rows=2 * 8, cols=16).reshape(shape)
    block = keep_block(dropout_key(11, 1, 2), 0.3, shape, start, size)
    index = tuple(slice(a, a + n) for a, n in zip(start, size))
    assert block.shape == size
    assert torch.equal(block, whole[index])
    assert 0 < int(block.sum()) < block.numel()


class _Rows(QueryRows):
    """Rank ``rank`` of ``ranks`` holding a slice of the queries, as a context-parallel rank does."""

    def __init__(self, rank: int, ranks: int) -> None:
        self.rank, self.ranks = rank, ranks

    def queries(self, held: int) -> tuple[list[tuple[int, int]], int]:
        return [(self.rank * held, held)], self.ranks * held


@pytest.mark.parametrize("ranks", [2, 4])
def test_attention_dropout_of_a_slice_of_the_queries_is_that_slice_of_the_whole(ranks: int) -> None:
    """A context-parallel rank (its queries a slice, its keys all of them), also holding a tensor-parallel rank's
    heads, draws the one-process decisions at its coordinates: same seed, the same keep mask there."""
    probs = torch.rand(2, 4, 8, 8)
    torch.manual_seed(5)
    whole = drop_probs(probs, 0.3, ALL_HEADS)
    rows = 8 // ranks
    for rank in range(ranks):
        for head in range(2):
            torch.manual_seed(5)
            part = drop_probs(probs[:, 2 * head:2 * head + 2, rank * rows:(rank + 1) * rows], 0.3, (head, 2),
                              _Rows(rank, ranks))
            assert torch.equal(part, whole[:, 2 * head:2 * head + 2, rank * rows:(rank + 1) * rows])
    assert 0 < int((whole == 0).sum()) < whole.numel() // 2


def test_a_recorder_sees_the_keyed_attention_dropout_instead_of_it_drawing() -> None:
    probs, seen = torch.rand(1, 2, 4, 4), []
    with recording_dropout(lambda t, p: seen.append((t, p))):
        assert drop_probs(probs, 0.25, ALL_HEADS) is probs
    assert len(seen) == 1 and seen[0][0] is probs and seen[0][1] == 0.25
    torch.manual_seed(0)
    assert (drop_probs(probs, 0.25, ALL_HEADS) == 0).any()  # outside it, the dropout draws again


def test_the_zig_zag_order_gives_rank_r_chunks_r_and_2p_minus_1_minus_r() -> None:
    assert zigzag_order(8, 4).tolist() == [0, 1, 6, 7, 2, 3, 4, 5]
    assert zigzag_order(8, 8).tolist() == [0, 7, 1, 6, 2, 5, 3, 4]
    # a rank's stream rows, as runs of sequence positions: rank 1 of 2 (stream rows 4-7) holds 2-3 and 4-5
    assert zigzag_runs(4, 4, 8, 4) == [(2, 2), (4, 2)]
    assert zigzag_runs(3, 3, 8, 4) == [(7, 1), (2, 2)]


def test_attention_dropout_of_zig_zag_chunks_is_those_rows_of_the_whole() -> None:
    probs = torch.rand(2, 4, 8, 8)
    torch.manual_seed(5)
    whole = drop_probs(probs, 0.3, ALL_HEADS)
    order = zigzag_order(8, 4)
    for rank in range(2):
        rows = order[4 * rank:4 * rank + 4]
        torch.manual_seed(5)
        part = drop_probs(probs[:, :, rows], 0.3, ALL_HEADS, _Zigzag(rank))
        assert torch.equal(part, whole[:, :, rows])


class _Zigzag(QueryRows):
    """Rank ``rank`` of 2, load-balanced: its 4 queries are chunks r and 3 - r of 4."""

    def __init__(self, rank: int) -> None:
        self.rank = rank

    def queries(self, held: int) -> tuple[list[tuple[int, int]], int]:
        return zigzag_runs(self.rank * held, held, 2 * held, 4), 2 * held
