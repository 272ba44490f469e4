"""The fused residual-boundary ops on CPU: parity with the unfused graph, gradients, registration, dropout identity."""
from __future__ import annotations

import pytest
import torch
from torch.utils.checkpoint import checkpoint

import blockir.lower.fused  # noqa: F401  (registers torch.ops.blockir.*)
from blockir.lower.fused import add_layer_norm, add_rms_norm
from blockir.lower.rng import dropout_key, keep_mask

from fused_conftest_helpers import CASES, Case, Inputs, fused, grads, make_inputs, unfused

SHAPE = (2, 5, 24)
DTYPES = {
    "fp32": (torch.float32, None),
    "bf16": (torch.bfloat16, None),
    "bf16_branch_fp32_residual": (torch.bfloat16, torch.float32),
    "fp16": (torch.float16, None),
}


@pytest.mark.parametrize("dtypes", DTYPES, ids=str)
@pytest.mark.parametrize("name", CASES)
def test_forward_is_the_unfused_graph_bit_for_bit(name: str, dtypes: str) -> None:
    case = CASES[name]
    dtype, residual_dtype = DTYPES[dtypes]
    x = make_inputs(case, SHAPE, dtype, residual_dtype, requires_grad=False)
    expected = unfused(case, x)
    got = fused(case, x)
    for e, g in zip(expected, got):
        assert g.dtype == e.dtype and g.shape == e.shape
        assert torch.equal(g, e)


def test_output_order_and_dtypes() -> None:
    """``(normalized, residual_out)``: the second is the post-add stream in the residual dtype."""
    case = Case(out_dtype=torch.bfloat16)
    x = make_inputs(case, SHAPE, torch.bfloat16, torch.float32, requires_grad=False)
    normalized, residual_out = fused(case, x)
    assert residual_out.dtype == torch.float32 and normalized.dtype == torch.bfloat16
    assert torch.equal(residual_out, x.residual + x.branch.float())
    assert not torch.equal(normalized.float(), residual_out)


@pytest.mark.parametrize("name", CASES)
def test_backward_matches_autograd_of_the_unfused_graph(name: str) -> None:
    case = CASES[name]
    x = make_inputs(case, SHAPE)
    expected = grads(unfused(case, x), x)
    got = grads(fused(case, x), x)
    assert expected.keys() == got.keys()
    for k in expected:
        torch.testing.assert_close(got[k], expected[k], rtol=1e-5, atol=1e-5, msg=k)


@pytest.mark.parametrize("name", ["ln_all", "rms_llama", "rms_gemma", "rms_t5"])
def test_bf16_gradients_within_twice_the_eager_error(name: str) -> None:
    """``|fused_bf16 - ref| <= 2 |eager_bf16 - ref| + atol`` with ref the unfused graph in fp64."""
    case = CASES[name]
    x = make_inputs(case, (3, 7, 40), torch.bfloat16)
    x64 = x.to(torch.float64)
    reference = grads(unfused(case, x64, torch.float64), x64)
    eager = grads(unfused(case, x), x)
    got = grads(fused(case, x), x)
    for k in reference:
        bound = 2 * (eager[k].double() - reference[k]).abs() + 2.0**-7 * reference[k].abs().max()
        assert ((got[k].double() - reference[k]).abs() <= bound).all(), k


@pytest.mark.parametrize("name", ["ln", "ln_all", "rms_llama", "rms_gemma", "rms_t5", "rms_offset_before"])
def test_gradcheck_fp64(name: str) -> None:
    case = CASES[name]
    x = make_inputs(case, (2, 3, 8), torch.float64)
    names = list(x.tensors())

    def f(*tensors: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        t = dict(zip(names, tensors))
        y = Inputs(t["branch"], t["residual"], t.get("weight"), t.get("bias"), t.get("branch_bias"),
                   t.get("branch_scale", x.branch_scale), x.key)
        return fused(case, y, torch.float64)

    assert torch.autograd.gradcheck(f, tuple(x.tensors().values()))


def _op_args(case: Case, x, dtype: torch.dtype) -> tuple:
    scale, const = (x.branch_scale, 1.0) if not isinstance(x.branch_scale, float) else (None, x.branch_scale)
    static = (case.p, case.training, const, case.shortcut_scale, case.out_dtype, dtype)
    if case.family == "layernorm":
        return (x.branch, x.residual, x.weight, x.bias, x.branch_bias, scale, x.key, case.eps) + static
    return (x.branch, x.residual, x.weight, x.branch_bias, scale, x.key, case.eps, case.offset, case.cast) + static


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("name", ["ln", "ln_plain", "ln_all", "rms_llama", "rms_gemma", "rms_t5"])
def test_opcheck_forward(name: str, dtype: torch.dtype) -> None:
    case = CASES[name]
    x = make_inputs(case, SHAPE, dtype)
    op = torch.ops.blockir.add_layer_norm if case.family == "layernorm" else torch.ops.blockir.add_rms_norm
    torch.library.opcheck(op.default, _op_args(case, x, dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("name", ["ln_all", "rms_gemma", "rms_llama"])
def test_opcheck_backward(name: str, dtype: torch.dtype) -> None:
    case = CASES[name]
    x = make_inputs(case, SHAPE, dtype, requires_grad=False)
    op = torch.ops.blockir.add_layer_norm if case.family == "layernorm" else torch.ops.blockir.add_rms_norm
    outputs = op(*_op_args(case, x, dtype))
    residual_out, stats = outputs[1], outputs[2:]
    mean, rstd = stats if len(stats) == 2 else (None, stats[0])
    g = torch.Generator().manual_seed(3)
    grad_normalized = torch.randn(outputs[0].shape, generator=g, dtype=dtype)
    grad_residual = torch.randn(residual_out.shape, generator=g, dtype=dtype)
    scale = x.branch_scale if isinstance(x.branch_scale, torch.Tensor) else None
    args = (grad_normalized, grad_residual, residual_out, mean, rstd, x.branch, x.weight, x.bias, x.branch_bias, scale,
            x.key, case.family, case.eps, case.offset, case.cast, case.p, case.training, 1.0, case.shortcut_scale,
            x.branch.dtype, dtype)
    torch.library.opcheck(torch.ops.blockir.add_norm_backward.default, args)


@pytest.mark.parametrize("name", ["ln_all", "rms_gemma"])
def test_compile_fullgraph_matches_eager(name: str) -> None:
    case = CASES[name]
    x = make_inputs(case, SHAPE)
    eager_out = fused(case, x)
    eager_grads = grads(eager_out, x)
    compiled = torch.compile(lambda inputs: fused(case, inputs), fullgraph=True, dynamic=False)
    out = compiled(x)
    for e, c in zip(eager_out, out):
        torch.testing.assert_close(c, e, rtol=0, atol=0)
    for k, v in grads(out, x).items():
        torch.testing.assert_close(v, eager_grads[k], rtol=1e-6, atol=1e-6, msg=k)


def test_export_keeps_the_fused_op() -> None:
    class Boundary(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.ones(SHAPE[-1]))

        def forward(self, branch: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return add_rms_norm(branch, residual, self.weight, eps=1e-6)

    args = (torch.randn(SHAPE), torch.randn(SHAPE))
    exported = torch.export.export(Boundary(), args)
    targets = {str(n.target) for n in exported.graph.nodes if n.op == "call_function"}
    assert "blockir.add_rms_norm.default" in targets
    for e, g in zip(Boundary()(*args), exported.module()(*args)):
        assert torch.equal(e, g)


# ---- dropout identity -----------------------------------------------------------------------


def _mask_through_op(p: float, key: torch.Tensor, rows: int, width: int) -> torch.Tensor:
    """The op's keep mask: with a unit branch and zero residual, residual_out is 1/(1-p) where kept."""
    branch = torch.ones(rows, width)
    _, residual_out = add_rms_norm(branch, torch.zeros(rows, width), torch.ones(width), p=p, training=True,
                                   dropout_key=key)
    kept = residual_out != 0
    assert torch.equal(residual_out[kept], torch.full_like(residual_out[kept], 1.0 / (1.0 - p)))
    return kept


def test_dropout_mask_is_the_rng_mask() -> None:
    key = dropout_key(torch.tensor(77), 4, 0)
    mask = _mask_through_op(0.3, key, 37, 50)
    assert torch.equal(mask, keep_mask(key, 0.3, 37, 50))


def test_dropout_mask_fed_to_the_reference_reproduces_the_op() -> None:
    case = CASES["ln_all"]
    x = make_inputs(case, SHAPE, requires_grad=False)
    mask = keep_mask(x.key, case.p, rows=SHAPE[0] * SHAPE[1], cols=SHAPE[-1]).reshape(SHAPE)
    dropped = torch.where(mask, (x.branch + x.branch_bias) * (1.0 / (1.0 - case.p)), 0.0) * x.branch_scale
    residual_out = case.shortcut_scale * x.residual + dropped
    normalized = torch.nn.functional.layer_norm(residual_out, (SHAPE[-1],), x.weight, x.bias, case.eps)
    got = fused(case, x)
    assert torch.equal(got[1], residual_out)
    assert torch.equal(got[0], normalized)


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_keep_rate_within_one_percent(p: float) -> None:
    mask = _mask_through_op(p, dropout_key(torch.tensor(5), 0, 0), 256, 1024)
    assert abs(mask.double().mean().item() - (1.0 - p)) < 0.01


def test_masks_differ_between_sites() -> None:
    seed = torch.tensor(11)
    masks = {(layer, branch): _mask_through_op(0.5, dropout_key(seed, layer, branch), 16, 64)
             for layer in range(3) for branch in range(2)}
    sites = list(masks)
    for i, a in enumerate(sites):
        for b in sites[i + 1:]:
            assert not torch.equal(masks[a], masks[b]), (a, b)


def test_eval_mode_ignores_dropout() -> None:
    case = CASES["rms_t5"]
    x = make_inputs(case, SHAPE, requires_grad=False)
    off = fused(case.with_(training=False), x)
    no_dropout = fused(case.with_(p=0.0), x)
    for a, b in zip(off, no_dropout):
        assert torch.equal(a, b)


@pytest.mark.parametrize("name", ["ln_all", "rms_gemma"])
def test_checkpoint_recompute_is_bit_identical(name: str) -> None:
    case = CASES[name]
    x = make_inputs(case, SHAPE)
    plain = fused(case, x)
    plain_grads = grads(plain, x)
    recomputed = checkpoint(lambda: fused(case, x), use_reentrant=False)
    for a, b in zip(plain, recomputed):
        assert torch.equal(a, b)
    for k, v in grads(recomputed, x).items():
        assert torch.equal(v, plain_grads[k]), k


# ---- saved state ----------------------------------------------------------------------------


def _saved(fn) -> list[torch.Tensor]:
    saved: list[torch.Tensor] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return saved


@pytest.mark.parametrize("name", ["ln_all", "rms_llama", "rms_gemma"])
def test_saves_residual_out_and_row_statistics_only(name: str) -> None:
    case = CASES[name]
    x = make_inputs(case, SHAPE, scale_requires_grad=False)
    outputs: list[torch.Tensor] = []
    saved = _saved(lambda: outputs.extend(fused(case, x)))
    full = [t for t in saved if t.shape == torch.Size(SHAPE)]
    assert len(full) == 1 and torch.equal(full[0], outputs[1])
    rows = [t for t in saved if t.shape == torch.Size(SHAPE[:-1])]  # one statistic per row, leading axes kept
    assert len(rows) == (2 if case.family == "layernorm" else 1)
    assert all(t.dtype == torch.float32 for t in rows)
    assert not any(t.dtype == torch.bool for t in saved)


def test_saves_the_branch_only_for_a_learned_scale() -> None:
    case = CASES["rms_offset_before"]
    learned = make_inputs(case, SHAPE)
    full = [t for t in _saved(lambda: fused(case, learned)) if t.shape == torch.Size(SHAPE)]
    assert len(full) == 2 and any(t is learned.branch for t in full)


# ---- argument checking ----------------------------------------------------------------------


def test_rejects_bad_arguments() -> None:
    x, r, w = torch.randn(4, 8), torch.randn(4, 8), torch.ones(8)
    with pytest.raises(ValueError, match="same shape"):
        add_rms_norm(x, torch.randn(4, 9), w)
    with pytest.raises(ValueError, match="weight must have shape"):
        add_rms_norm(x, r, torch.ones(9))
    with pytest.raises(ValueError, match="dropout_key"):
        add_rms_norm(x, r, w, p=0.1, training=True)
    with pytest.raises(ValueError, match="cast order"):
        add_rms_norm(x, r, w, cast="sometimes")
    with pytest.raises(ValueError, match="dropout probability"):
        add_layer_norm(x, r, p=1.0, training=True, dropout_key=1)
    with pytest.raises(ValueError, match="branch_scale"):
        add_layer_norm(x, r, branch_scale=torch.ones(3))
