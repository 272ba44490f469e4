"""The Triton kernels against the unfused graph.

Without a GPU the kernels run on CPU tensors under the Triton interpreter:
``kernels.load_interpreted()`` builds a copy of the kernels module with
``TRITON_INTERPRET=1`` set, whatever was imported before, and ``cpu_kernels``
routes the ops' CPU path through it. With a GPU the same checks launch the
compiled kernels on CUDA tensors. Interpreter runs are slow, so shapes are small.
"""
from __future__ import annotations

import pytest
import torch
from torch.utils.checkpoint import checkpoint

triton = pytest.importorskip("triton")

from blockir.lower.fused import cpu_kernels  # noqa: E402
from blockir.lower.fused import kernels as compiled_kernels  # noqa: E402
from blockir.lower.fused import spec as abi  # noqa: E402
from blockir.lower.fused.spec import BackwardInputs, BoundarySpec, Family  # noqa: E402
from blockir.lower.rng import dropout_key, keep_mask  # noqa: E402

from fused_conftest_helpers import CASES, Case, Inputs, fused, grads, make_inputs, unfused  # noqa: E402

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
K = compiled_kernels if CUDA else compiled_kernels.load_interpreted()


def run_kernels(case: Case, x: Inputs) -> tuple[tuple[torch.Tensor, torch.Tensor], dict[str, torch.Tensor]]:
    """Outputs and input gradients of the op with the Triton kernels behind it."""
    with cpu_kernels(K):
        out = fused(case, x)
        return out, grads(out, x)


def run_unfused(case: Case, x: Inputs, accum: torch.dtype = torch.float32):
    out = unfused(case, x, accum)
    return out, grads(out, x)


def assert_relative(got: torch.Tensor, ref: torch.Tensor, rel: float = 1e-5, what: str = "") -> None:
    """Max error at most ``rel`` times the reference's largest magnitude."""
    err = (got.double() - ref.double()).abs().max().item()
    scale = ref.double().abs().max().item()
    assert err <= rel * scale, f"{what}: max error {err:.3e} > {rel} * {scale:.3e}"


@pytest.fixture(params=["row", "looped"])
def variant(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """One row per program, or the chunked kernels forced by a small block limit."""
    if request.param == "looped":
        monkeypatch.setattr(K, "MAX_ROW_BLOCK", 64)
        monkeypatch.setattr(K, "LOOP_BLOCK", 64)
    return request.param


@pytest.mark.skipif(CUDA, reason="the interpreter copy is only built without a GPU")
def test_interpreter_is_in_effect() -> None:
    from triton.runtime.interpreter import InterpretedFunction

    assert K.jit.INTERPRETED
    assert isinstance(K.jit.forward_row_kernel, InterpretedFunction)
    assert isinstance(K.jit.backward_looped_kernel, InterpretedFunction)


@pytest.mark.parametrize("rows, width", [(13, 123), (3, 769)])
def test_dropout_mask_is_bit_identical_to_rng(rows: int, width: int) -> None:
    key = dropout_key(torch.tensor(2024), 7, 1).to(DEVICE)
    spec = BoundarySpec(Family.RMS, 1e-6, p=0.3, training=True)
    branch = torch.ones(rows, width, device=DEVICE)
    x = abi.Inputs(branch, torch.zeros_like(branch), torch.ones(width, device=DEVICE), None, None, None, key)
    _, residual_out, _, _ = K.forward(x, spec)
    assert torch.equal((residual_out != 0).cpu(), keep_mask(key.cpu(), 0.3, rows, width))


# (case, rows, width): odd widths, row counts that are not powers of two
FP32_GRID = [
    ("ln_all", 7, 123),
    ("rms_llama", 5, 769),
    ("rms_gemma", 3, 3000),
    ("rms_t5", 6, 123),
    ("ln_plain", 3, 769),
    ("rms_offset_before", 2, 3000),
]


@pytest.mark.parametrize("name, rows, width", FP32_GRID)
def test_fp32_matches_reference(name: str, rows: int, width: int) -> None:
    case = CASES[name]
    x = make_inputs(case, (rows, width), device=DEVICE)
    (normalized, residual_out), got = run_kernels(case, x)
    (ref_normalized, ref_residual_out), expected = run_unfused(case, x)
    assert torch.equal(residual_out, ref_residual_out)
    assert_relative(normalized, ref_normalized, what="normalized")
    for k in expected:
        assert_relative(got[k], expected[k], what=k)


@pytest.mark.parametrize("name", ["ln_all", "rms_gemma", "rms_offset_before"])
def test_looped_variant_matches_reference(name: str, variant: str) -> None:
    case = CASES[name]
    x = make_inputs(case, (3, 300), device=DEVICE, seed=5)
    (normalized, residual_out), got = run_kernels(case, x)
    (ref_normalized, ref_residual_out), expected = run_unfused(case, x)
    assert torch.equal(residual_out, ref_residual_out)
    assert_relative(normalized, ref_normalized, what=f"{variant} normalized")
    for k in expected:
        assert_relative(got[k], expected[k], what=f"{variant} {k}")


# one bf16 ulp at the top of the tensor's range: outputs are stored in bf16, and the norm backward
# mixes a whole row, so any element may carry about one rounding of the row's largest value
HALF_ATOL = 2.0**-7

# (case, branch dtype, residual dtype, shape)
HALF_GRID = [
    ("ln_all", torch.bfloat16, torch.bfloat16, (2, 5, 123)),
    ("rms_llama", torch.bfloat16, torch.bfloat16, (3, 3, 769)),
    ("rms_gemma", torch.bfloat16, torch.bfloat16, (9, 123)),
    ("rms_t5", torch.bfloat16, torch.bfloat16, (9, 123)),
    ("rms_llama", torch.bfloat16, torch.float32, (2, 4, 123)),  # fp32 residual stream
    ("ln_all", torch.bfloat16, torch.float32, (7, 123)),
    ("rms_offset_before", torch.float16, torch.float16, (5, 123)),
]


@pytest.mark.parametrize("name, dtype, residual_dtype, shape", HALF_GRID)
def test_half_within_twice_the_eager_error(name: str, dtype: torch.dtype, residual_dtype: torch.dtype,
                                           shape: tuple[int, ...], variant: str) -> None:
    """``|kernel - ref| <= 2 |eager - ref| + atol``, eager in the half dtype, ref the unfused graph in fp64."""
    case = CASES[name]
    x = make_inputs(case, shape, dtype, residual_dtype, device=DEVICE, seed=7)
    (normalized, residual_out), got = run_kernels(case, x)
    (eager_normalized, eager_residual_out), eager = run_unfused(case, x)
    x64 = x.to(torch.float64)
    (ref_normalized, _), ref = run_unfused(case, x64, torch.float64)

    assert torch.equal(residual_out, eager_residual_out)
    pairs = [("normalized", normalized, eager_normalized, ref_normalized)]
    pairs += [(k, got[k], eager[k], ref[k]) for k in ref]
    for what, g, e, r in pairs:
        bound = 2 * (e.double() - r).abs() + HALF_ATOL * r.abs().max().item()
        excess = ((g.double() - r).abs() - bound).max().item()
        assert excess <= 0, f"{what}: error exceeds the bound by {excess:.3e}"


@pytest.mark.parametrize("name", ["ln_all", "rms_gemma"])
def test_checkpoint_recompute_is_bit_identical(name: str) -> None:
    case = CASES[name]
    x = make_inputs(case, (2, 3, 123), device=DEVICE, seed=9)
    (plain, plain_grads) = run_kernels(case, x)
    with cpu_kernels(K):
        recomputed = checkpoint(lambda: fused(case, x), use_reentrant=False)
        recomputed_grads = grads(recomputed, x)
    for a, b in zip(plain, recomputed):
        assert torch.equal(a, b)
    for k, v in recomputed_grads.items():
        assert torch.equal(v, plain_grads[k]), k


def test_kernel_backward_returns_every_gradient() -> None:
    """Direct launcher call: six gradients, absent ones None, shapes and dtypes of their inputs."""
    case = CASES["ln_all"]
    x = make_inputs(case, (4, 123), torch.bfloat16, torch.float32, device=DEVICE, requires_grad=False)
    spec = BoundarySpec(Family.LAYER, case.eps, p=case.p, training=True, shortcut_scale=case.shortcut_scale)
    inputs = abi.Inputs(x.branch, x.residual, x.weight, x.bias, x.branch_bias, x.branch_scale, x.key)
    _, residual_out, mean, rstd = K.forward(inputs, spec)
    g = torch.randn(residual_out.shape, device=DEVICE)
    d_branch, d_residual, d_weight, d_bias, d_branch_bias, d_scale = K.backward(
        BackwardInputs(g, g, residual_out, mean, rstd, x.branch, x.weight, x.bias, x.branch_bias, x.branch_scale, x.key),
        x.branch.dtype, spec)
    assert d_branch.dtype == torch.bfloat16 and d_residual.dtype == torch.float32
    pairs = [(d_weight, x.weight), (d_bias, x.bias), (d_branch_bias, x.branch_bias), (d_scale, x.branch_scale)]
    for grad, like in pairs:
        assert grad.shape == like.shape and grad.dtype == like.dtype
    no_scale_grad = K.backward(BackwardInputs(g, None, residual_out, mean, rstd, None, None, None, None,
                                              x.branch_scale, x.key), x.branch.dtype, spec)
    assert no_scale_grad[2:] == (None, None, None, None)


# ---- compiled kernels -----------------------------------------------------------------------


KERNELS = {name: getattr(compiled_kernels.jit, name) for name in
           ("forward_row_kernel", "forward_looped_kernel", "backward_row_kernel", "backward_looped_kernel")}


class _Recorder:
    """Stands in for a kernel and records the launch arguments."""

    def __init__(self) -> None:
        self.launches: list[tuple[tuple, dict]] = []

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.launches.append((args, kwargs))


def _triton_type(value) -> str:
    if isinstance(value, torch.Tensor):
        names = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16", torch.int64: "i64"}
        return "*" + names[value.dtype]
    if isinstance(value, bool):
        return "i1"
    if isinstance(value, int):
        return "i32"
    return "fp32"


@pytest.mark.skipif(CUDA, reason="on a GPU the kernels are compiled and launched by the other tests")
@pytest.mark.parametrize("name, looped, residual_dtype", [
    ("ln_all", False, torch.float32),
    ("rms_gemma", False, torch.float32),
    ("rms_t5", False, torch.bfloat16),
    ("rms_llama", False, torch.bfloat16),
    ("ln_all", True, torch.bfloat16),
    ("rms_offset_before", True, torch.float32),
])
def test_kernels_compile_for_hopper(name: str, looped: bool, residual_dtype: torch.dtype,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Compile every launch the launchers make, with their exact argument types, for sm_90 (no GPU needed)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    if compiled_kernels.jit.INTERPRETED:
        pytest.skip("TRITON_INTERPRET=1 is set for the whole process")
    case = CASES[name]
    x = make_inputs(case, (4, 3000), torch.bfloat16, residual_dtype, requires_grad=False)
    spec = BoundarySpec(case.family, case.eps, case.offset, case.cast, case.p, True, 1.0, case.shortcut_scale)
    mean, rstd = torch.zeros(4), torch.ones(4)
    recorders = {}
    for kernel in KERNELS:
        recorders[kernel] = _Recorder()
        monkeypatch.setattr(compiled_kernels.jit, kernel, recorders[kernel])
    block = 512 if looped else None
    scale = x.branch_scale if isinstance(x.branch_scale, torch.Tensor) else None
    compiled_kernels.forward(abi.Inputs(x.branch, x.residual, x.weight, x.bias, x.branch_bias, scale, x.key), spec,
                             block)
    compiled_kernels.backward(BackwardInputs(x.residual, x.residual, x.residual,
                                             mean if spec.family is Family.LAYER else None, rstd, x.branch, x.weight,
                                             x.bias, x.branch_bias, scale, x.key), x.branch.dtype, spec, block)
    launched = 0
    for kernel, recorder in recorders.items():
        for args, kwargs in recorder.launches:
            launched += 1
            jit_fn = KERNELS[kernel]
            names = jit_fn.arg_names
            options = {k: kwargs.pop(k) for k in ("num_warps", "enable_fp_fusion")}
            signature = {n: _triton_type(a) for n, a in zip(names, args)}
            signature.update({n: "constexpr" for n in kwargs})
            constexprs = {(names.index(n),): v for n, v in kwargs.items()}
            source = ASTSource(fn=jit_fn, signature=signature, constexprs=constexprs)
            compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)
            assert "cubin" in compiled.asm
    assert launched == 2


# ---- real GPU -------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("width", [4096, 16384, 20000])
@pytest.mark.parametrize("name", ["ln_all", "rms_llama", "rms_gemma"])
def test_gpu_bf16_large_rows(name: str, width: int) -> None:
    case = CASES[name]
    x = make_inputs(case, (2, 129, width), torch.bfloat16, device="cuda", seed=11)
    (normalized, residual_out), got = run_kernels(case, x)
    (eager_normalized, eager_residual_out), eager = run_unfused(case, x)
    (ref_normalized, _), ref = run_unfused(case, x.to(torch.float64), torch.float64)
    assert torch.equal(residual_out, eager_residual_out)
    pairs = [("normalized", normalized, eager_normalized, ref_normalized)]
    pairs += [(k, got[k], eager[k], ref[k]) for k in ref]
    for what, g, e, r in pairs:
        bound = 2 * (e.double() - r).abs() + HALF_ATOL * r.abs().max()
        assert ((g.double() - r).abs() <= bound).all(), what


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
def test_gpu_compiled_graph_matches_eager() -> None:
    case = CASES["rms_gemma"]
    x = make_inputs(case, (4, 64, 1024), torch.bfloat16, torch.float32, device="cuda")
    eager = fused(case, x)
    compiled = torch.compile(lambda inputs: fused(case, inputs), fullgraph=True)(x)
    for a, b in zip(eager, compiled):
        assert torch.equal(a, b)


def test_cuda_dispatch_falls_back_to_the_reference_outside_the_kernels_range() -> None:
    from blockir.lower.fused import ops, reference

    spec = BoundarySpec(Family.RMS, 1e-6)
    assert ops._cuda_impl(spec, torch.empty(0, dtype=torch.bfloat16), torch.empty(0)) is compiled_kernels
    assert ops._cuda_impl(spec, torch.empty(0, dtype=torch.float64)) is reference
    assert ops._cuda_impl(spec, torch.empty(0), extra=(torch.float64,)) is reference
    assert ops._cuda_impl(BoundarySpec(Family.RMS, 1e-6, accum=torch.float64), torch.empty(0)) is reference
