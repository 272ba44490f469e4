"""Triton device code of the fused residual boundary: shared helpers, forward and backward kernels.

Layout: the input is viewed as ``[rows, D]``. When ``D`` fits one block
(``BLOCK = next_power_of_2(D)``) a program owns one row and keeps it in
registers; wider rows use the looped kernels, which walk the row in
``BLOCK``-wide chunks. Statistics and the backward reductions are accumulated
in fp32. Each intermediate of the update is rounded to the dtype eager PyTorch
gives it (see ``spec.py``), so the kernels follow the unfused graph's dataflow
rather than a more precise but different one.

Dropout is the counter-based hash of ``blockir.lower.rng`` evaluated in
uint32 arithmetic, so a kernel's mask is bit-identical to ``rng.keep_mask``
and the backward regenerates it instead of loading a stored mask.

The affine-parameter gradients are reduced in two steps: every backward
program accumulates its rows into one fp32 row of a ``[programs, D]``
buffer, and torch sums the buffer. ``kernels.py`` launches these kernels.
"""
from __future__ import annotations

import triton
import triton.language as tl
from triton import knobs
from triton.runtime.interpreter import InterpretedFunction
from triton.runtime.jit import JITFunction

from blockir.lower.rng import FMIX_C1, FMIX_C2, KEEP_BITS

# True when this copy of the module was built for the Triton interpreter (CPU tensors)
INTERPRETED: bool = bool(knobs.runtime.interpret)

# Under the interpreter every jit function a kernel calls must itself be interpreted. When triton
# was imported before the interpreter was switched on (see kernels.load_interpreted), the standard
# library's tl.sum is a compile-only JITFunction, so this copy wraps its source instead.
_sum = InterpretedFunction(tl.sum.fn) if INTERPRETED and isinstance(tl.sum, JITFunction) else tl.sum
# The interpreter patches, and afterwards restores, the language modules a kernel's globals
# name. tl.sum's source patches triton.language.core; naming that module here makes the launch
# undo those patches too, so compiling kernels later in the same process is unaffected.
_tl_core = tl.core

_C1 = tl.constexpr(FMIX_C1)
_C2 = tl.constexpr(FMIX_C2)
_DROP_SHIFT = tl.constexpr(32 - KEEP_BITS)

# ---- device helpers -------------------------------------------------------------------------


@triton.jit
def _fmix32(h):
    h ^= h >> 16
    h *= _C1
    h ^= h >> 13
    h *= _C2
    h ^= h >> 16
    return h


@triton.jit
def _row_hash(key_ptr, row, DROPOUT: tl.constexpr):
    """First half of ``rng.element_hash``: the key folded with the flattened row index."""
    h = tl.cast(row, tl.uint32)
    if DROPOUT:
        h = _fmix32(h ^ tl.load(key_ptr).to(tl.uint32))
    return h


@triton.jit
def _keep(row_hash, cols, threshold):
    return (_fmix32(row_hash + cols.to(tl.uint32)) >> _DROP_SHIFT) >= threshold


@triton.jit
def _round(x, T: tl.constexpr, SOFT_BF16: tl.constexpr):
    """``x`` (fp32) rounded to ``T`` and widened back to fp32.

    The interpreter truncates fp32 -> bf16 where GPUs round to nearest even,
    so under it bf16 rounding is done on the bits.
    """
    if T == tl.float32:
        return x
    elif SOFT_BF16 and T == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + (0x7FFF + ((bits >> 16) & 1))) & 0xFFFF0000
        return bits.to(tl.float32, bitcast=True)
    else:
        return x.to(T).to(tl.float32)


@triton.jit
def _update(branch_ptr, branch_bias_ptr, scale_ptr, cols, mask, row_hash, threshold, keep_scale, scale_const,
            HAS_BRANCH_BIAS: tl.constexpr, DROPOUT: tl.constexpr, SCALE: tl.constexpr, HAS_CONST: tl.constexpr,
            T1: tl.constexpr, T2: tl.constexpr, SOFT: tl.constexpr):
    """The branch update (before the cast to the residual dtype) and the dropped branch before scaling."""
    u = tl.load(branch_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_BRANCH_BIAS:
        u = _round(u + tl.load(branch_bias_ptr + cols, mask=mask, other=0.0).to(tl.float32), T1, SOFT)
    if DROPOUT:
        u = tl.where(_keep(row_hash, cols, threshold), _round(u * keep_scale, T1, SOFT), 0.0)
    dropped = u
    if SCALE == 1:
        u = _round(u * tl.load(scale_ptr).to(tl.float32), T2, SOFT)
    elif SCALE == 2:
        u = _round(u * tl.load(scale_ptr + cols, mask=mask, other=0.0).to(tl.float32), T2, SOFT)
    if HAS_CONST:
        u = _round(u * scale_const, T2, SOFT)
    return u, dropped


@triton.jit
def _residual_out(residual_ptr, update, cols, mask, shortcut_scale, HAS_SHORTCUT: tl.constexpr,
                  RES: tl.constexpr, SOFT: tl.constexpr):
    shortcut = tl.load(residual_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_SHORTCUT:
        shortcut = _round(shortcut * shortcut_scale, RES, SOFT)
    return _round(shortcut + _round(update, RES, SOFT), RES, SOFT)


@triton.jit
def _norm_weight(weight_ptr, cols, mask, LAYER: tl.constexpr, CAST: tl.constexpr, OFFSET: tl.constexpr,
                 W_T: tl.constexpr, SOFT: tl.constexpr):
    """The effective scale ``offset + weight`` in fp32, rounded where the reference rounds it."""
    w = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    if not LAYER and OFFSET != 0:
        if CAST == 1:
            w = w + OFFSET
        else:
            w = _round(w + OFFSET, W_T, SOFT)
    return w


@triton.jit
def _weight_operand(x_hat, LAYER: tl.constexpr, CAST: tl.constexpr, W_HALF: tl.constexpr, RES: tl.constexpr,
                    W_T: tl.constexpr, SOFT: tl.constexpr):
    """What the weight multiplies in the forward (its gradient is taken against this)."""
    if not LAYER and CAST == 0:
        return _round(x_hat, RES, SOFT)
    elif not LAYER and CAST == 2 and W_HALF:
        return _round(x_hat, W_T, SOFT)
    else:
        return x_hat


@triton.jit
def _normalized(x, mean, rstd, weight_ptr, bias_ptr, cols, mask,
                LAYER: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr, CAST: tl.constexpr,
                OFFSET: tl.constexpr, W_HALF: tl.constexpr, RES: tl.constexpr, W_T: tl.constexpr,
                NORM_T: tl.constexpr, OUT_T: tl.constexpr, SOFT: tl.constexpr):
    """The norm output for one chunk, rounded to the norm's dtype and then to the output dtype."""
    if LAYER:
        y = (x - mean) * rstd
        if HAS_W:
            y = y * tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        if HAS_B:
            y = y + tl.load(bias_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    else:
        w = _norm_weight(weight_ptr, cols, mask, LAYER, CAST, OFFSET, W_T, SOFT)
        if CAST == 1:
            y = x * rstd * w
        else:
            y = w * _weight_operand(x * rstd, LAYER, CAST, W_HALF, RES, W_T, SOFT)
    return _round(_round(y, NORM_T, SOFT), OUT_T, SOFT)


# ---- forward --------------------------------------------------------------------------------


@triton.jit
def forward_row_kernel(
    branch_ptr, residual_ptr, weight_ptr, bias_ptr, branch_bias_ptr, scale_ptr, key_ptr,
    out_ptr, residual_out_ptr, mean_ptr, rstd_ptr,
    D, eps, threshold, keep_scale, scale_const, shortcut_scale,
    LAYER: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr, HAS_BRANCH_BIAS: tl.constexpr,
    SCALE: tl.constexpr, HAS_CONST: tl.constexpr, HAS_SHORTCUT: tl.constexpr, DROPOUT: tl.constexpr,
    CAST: tl.constexpr, OFFSET: tl.constexpr, W_HALF: tl.constexpr,
    T1: tl.constexpr, T2: tl.constexpr, RES: tl.constexpr, W_T: tl.constexpr, NORM_T: tl.constexpr,
    OUT_T: tl.constexpr, SOFT: tl.constexpr, BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    base = tl.cast(row, tl.int64) * D
    cols = tl.arange(0, BLOCK)
    mask = cols < D
    row_hash = _row_hash(key_ptr, row, DROPOUT)

    update, _ = _update(branch_ptr + base, branch_bias_ptr, scale_ptr, cols, mask, row_hash, threshold, keep_scale,
                        scale_const, HAS_BRANCH_BIAS, DROPOUT, SCALE, HAS_CONST, T1, T2, SOFT)
    x = _residual_out(residual_ptr + base, update, cols, mask, shortcut_scale, HAS_SHORTCUT, RES, SOFT)
    tl.store(residual_out_ptr + base + cols, x, mask=mask)

    if LAYER:
        mean = _sum(x, axis=0) / D
        centered = tl.where(mask, x - mean, 0.0)
        rstd = tl.rsqrt(_sum(centered * centered, axis=0) / D + eps)
        tl.store(mean_ptr + row, mean)
    else:
        mean = 0.0
        rstd = tl.rsqrt(_sum(x * x, axis=0) / D + eps)
    tl.store(rstd_ptr + row, rstd)

    y = _normalized(x, mean, rstd, weight_ptr, bias_ptr, cols, mask, LAYER, HAS_W, HAS_B, CAST, OFFSET, W_HALF,
                    RES, W_T, NORM_T, OUT_T, SOFT)
    tl.store(out_ptr + base + cols, y, mask=mask)


@triton.jit
def forward_looped_kernel(
    branch_ptr, residual_ptr, weight_ptr, bias_ptr, branch_bias_ptr, scale_ptr, key_ptr,
    out_ptr, residual_out_ptr, mean_ptr, rstd_ptr,
    D, eps, threshold, keep_scale, scale_const, shortcut_scale,
    LAYER: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr, HAS_BRANCH_BIAS: tl.constexpr,
    SCALE: tl.constexpr, HAS_CONST: tl.constexpr, HAS_SHORTCUT: tl.constexpr, DROPOUT: tl.constexpr,
    CAST: tl.constexpr, OFFSET: tl.constexpr, W_HALF: tl.constexpr,
    T1: tl.constexpr, T2: tl.constexpr, RES: tl.constexpr, W_T: tl.constexpr, NORM_T: tl.constexpr,
    OUT_T: tl.constexpr, SOFT: tl.constexpr, BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    base = tl.cast(row, tl.int64) * D
    row_hash = _row_hash(key_ptr, row, DROPOUT)

    # pass 1: write the new residual stream, accumulate the first moment (RMSNorm: the second)
    acc = tl.full((BLOCK,), 0.0, tl.float32)
    for start in range(0, D, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < D
        update, _ = _update(branch_ptr + base, branch_bias_ptr, scale_ptr, cols, mask, row_hash, threshold,
                            keep_scale, scale_const, HAS_BRANCH_BIAS, DROPOUT, SCALE, HAS_CONST, T1, T2, SOFT)
        x = _residual_out(residual_ptr + base, update, cols, mask, shortcut_scale, HAS_SHORTCUT, RES, SOFT)
        tl.store(residual_out_ptr + base + cols, x, mask=mask)
        if LAYER:
            acc += x
        else:
            acc += x * x
    # later passes re-read residual_out written by other threads of this program
    tl.debug_barrier()

    if LAYER:
        mean = _sum(acc, axis=0) / D
        # pass 2: centred second moment (two-pass, no E[x^2] - E[x]^2 cancellation)
        acc = tl.full((BLOCK,), 0.0, tl.float32)
        for start in range(0, D, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            mask = cols < D
            x = tl.load(residual_out_ptr + base + cols, mask=mask, other=0.0).to(tl.float32)
            centered = tl.where(mask, x - mean, 0.0)
            acc += centered * centered
        tl.store(mean_ptr + row, mean)
    else:
        mean = 0.0
    rstd = tl.rsqrt(_sum(acc, axis=0) / D + eps)
    tl.store(rstd_ptr + row, rstd)

    # pass 3: normalize
    for start in range(0, D, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < D
        x = tl.load(residual_out_ptr + base + cols, mask=mask, other=0.0).to(tl.float32)
        y = _normalized(x, mean, rstd, weight_ptr, bias_ptr, cols, mask, LAYER, HAS_W, HAS_B, CAST, OFFSET,
                        W_HALF, RES, W_T, NORM_T, OUT_T, SOFT)
        tl.store(out_ptr + base + cols, y, mask=mask)


# ---- backward -------------------------------------------------------------------------------


@triton.jit
def _row_grads(x, gy, mean, rstd, w, mask, LAYER: tl.constexpr, HAS_W: tl.constexpr):
    """``x_hat`` and the two row reductions of the norm backward for one chunk."""
    if LAYER:
        x_hat = tl.where(mask, (x - mean) * rstd, 0.0)
    else:
        x_hat = x * rstd
    if HAS_W:
        g_hat = gy * w
    else:
        g_hat = gy
    return x_hat, g_hat


@triton.jit
def _input_grad(x_hat, g_hat, c_scale, c_mean, rstd, grad_res_ptr, cols, mask,
                LAYER: tl.constexpr, HAS_GRAD_RES: tl.constexpr):
    """Gradient reaching the new residual stream: through the norm, plus its own upstream gradient."""
    gx = g_hat - x_hat * c_scale
    if LAYER:
        gx = gx - c_mean
    g = tl.where(mask, gx * rstd, 0.0)
    if HAS_GRAD_RES:
        g += tl.load(grad_res_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    return g


@triton.jit
def _branch_grad(g, scale_ptr, cols, mask, row_hash, threshold, keep_scale, scale_const,
                 SCALE: tl.constexpr, HAS_CONST: tl.constexpr, DROPOUT: tl.constexpr):
    """Gradient of the branch (and of its bias) from the gradient of the update."""
    if SCALE == 1:
        g = g * tl.load(scale_ptr).to(tl.float32)
    elif SCALE == 2:
        g = g * tl.load(scale_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_CONST:
        g = g * scale_const
    if DROPOUT:
        g = tl.where(_keep(row_hash, cols, threshold), g * keep_scale, 0.0)
    return g


@triton.jit
def backward_row_kernel(
    grad_out_ptr, grad_res_ptr, residual_out_ptr, mean_ptr, rstd_ptr, branch_ptr, weight_ptr, branch_bias_ptr,
    scale_ptr, key_ptr,
    d_branch_ptr, d_residual_ptr, dw_part_ptr, db_part_ptr, dbb_part_ptr, dscale_part_ptr,
    rows, D, rows_per_program, threshold, keep_scale, scale_const, shortcut_scale,
    LAYER: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr, HAS_GRAD_RES: tl.constexpr,
    HAS_BRANCH_BIAS: tl.constexpr, SCALE: tl.constexpr, SCALE_GRAD: tl.constexpr, HAS_CONST: tl.constexpr,
    HAS_SHORTCUT: tl.constexpr, DROPOUT: tl.constexpr, CAST: tl.constexpr, OFFSET: tl.constexpr,
    W_HALF: tl.constexpr, T1: tl.constexpr, T2: tl.constexpr, RES: tl.constexpr, W_T: tl.constexpr,
    BRANCH_T: tl.constexpr, SOFT: tl.constexpr, BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < D
    w = 0.0
    if HAS_W:
        w = _norm_weight(weight_ptr, cols, mask, LAYER, CAST, OFFSET, W_T, SOFT)
    dw = tl.full((BLOCK,), 0.0, tl.float32)
    db = tl.full((BLOCK,), 0.0, tl.float32)
    dbb = tl.full((BLOCK,), 0.0, tl.float32)
    dscale = tl.full((BLOCK,), 0.0, tl.float32)

    row_start = pid * rows_per_program
    row_end = tl.minimum(row_start + rows_per_program, rows)
    for row in range(row_start, row_end):
        base = tl.cast(row, tl.int64) * D
        x = tl.load(residual_out_ptr + base + cols, mask=mask, other=0.0).to(tl.float32)
        gy = tl.load(grad_out_ptr + base + cols, mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(rstd_ptr + row)
        mean = 0.0
        if LAYER:
            mean = tl.load(mean_ptr + row)
        x_hat, g_hat = _row_grads(x, gy, mean, rstd, w, mask, LAYER, HAS_W)
        c_scale = _sum(g_hat * x_hat, axis=0) / D
        c_mean = 0.0
        if LAYER:
            c_mean = _sum(g_hat, axis=0) / D
        g = _input_grad(x_hat, g_hat, c_scale, c_mean, rstd, grad_res_ptr + base, cols, mask, LAYER, HAS_GRAD_RES)

        d_residual = g
        if HAS_SHORTCUT:
            d_residual = g * shortcut_scale
        tl.store(d_residual_ptr + base + cols, _round(d_residual, RES, SOFT), mask=mask)
        if HAS_W:
            dw += gy * _weight_operand(x_hat, LAYER, CAST, W_HALF, RES, W_T, SOFT)
        if HAS_B:
            db += gy

        row_hash = _row_hash(key_ptr, row, DROPOUT)
        if SCALE_GRAD:
            _, dropped = _update(branch_ptr + base, branch_bias_ptr, scale_ptr, cols, mask, row_hash, threshold,
                                 keep_scale, scale_const, HAS_BRANCH_BIAS, DROPOUT, SCALE, HAS_CONST, T1, T2, SOFT)
            dscale += g * dropped
        g = _branch_grad(g, scale_ptr, cols, mask, row_hash, threshold, keep_scale, scale_const, SCALE, HAS_CONST,
                         DROPOUT)
        if HAS_BRANCH_BIAS:
            dbb += g
        tl.store(d_branch_ptr + base + cols, _round(g, BRANCH_T, SOFT), mask=mask)

    part = pid.to(tl.int64) * D + cols
    if HAS_W:
        tl.store(dw_part_ptr + part, dw, mask=mask)
    if HAS_B:
        tl.store(db_part_ptr + part, db, mask=mask)
    if HAS_BRANCH_BIAS:
        tl.store(dbb_part_ptr + part, dbb, mask=mask)
    if SCALE_GRAD:
        tl.store(dscale_part_ptr + part, dscale, mask=mask)


@triton.jit
def _accumulate(part_ptr, values, mask):
    tl.store(part_ptr, tl.load(part_ptr, mask=mask, other=0.0) + values, mask=mask)


@triton.jit
def backward_looped_kernel(
    grad_out_ptr, grad_res_ptr, residual_out_ptr, mean_ptr, rstd_ptr, branch_ptr, weight_ptr, branch_bias_ptr,
    scale_ptr, key_ptr,
    d_branch_ptr, d_residual_ptr, dw_part_ptr, db_part_ptr, dbb_part_ptr, dscale_part_ptr,
    rows, D, rows_per_program, threshold, keep_scale, scale_const, shortcut_scale,
    LAYER: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr, HAS_GRAD_RES: tl.constexpr,
    HAS_BRANCH_BIAS: tl.constexpr, SCALE: tl.constexpr, SCALE_GRAD: tl.constexpr, HAS_CONST: tl.constexpr,
    HAS_SHORTCUT: tl.constexpr, DROPOUT: tl.constexpr, CAST: tl.constexpr, OFFSET: tl.constexpr,
    W_HALF: tl.constexpr, T1: tl.constexpr, T2: tl.constexpr, RES: tl.constexpr, W_T: tl.constexpr,
    BRANCH_T: tl.constexpr, SOFT: tl.constexpr, BLOCK: tl.constexpr,
):
    # the partial-sum rows start zeroed; each program adds into its own row chunk by chunk
    pid = tl.program_id(0)
    row_start = pid * rows_per_program
    row_end = tl.minimum(row_start + rows_per_program, rows)
    part_base = pid.to(tl.int64) * D
    for row in range(row_start, row_end):
        base = tl.cast(row, tl.int64) * D
        rstd = tl.load(rstd_ptr + row)
        mean = 0.0
        if LAYER:
            mean = tl.load(mean_ptr + row)

        # pass 1: the two row reductions of the norm backward
        acc_scale = tl.full((BLOCK,), 0.0, tl.float32)
        acc_mean = tl.full((BLOCK,), 0.0, tl.float32)
        for start in range(0, D, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            mask = cols < D
            x = tl.load(residual_out_ptr + base + cols, mask=mask, other=0.0).to(tl.float32)
            gy = tl.load(grad_out_ptr + base + cols, mask=mask, other=0.0).to(tl.float32)
            w = 0.0
            if HAS_W:
                w = _norm_weight(weight_ptr, cols, mask, LAYER, CAST, OFFSET, W_T, SOFT)
            x_hat, g_hat = _row_grads(x, gy, mean, rstd, w, mask, LAYER, HAS_W)
            acc_scale += g_hat * x_hat
            acc_mean += g_hat
        c_scale = _sum(acc_scale, axis=0) / D
        c_mean = 0.0
        if LAYER:
            c_mean = _sum(acc_mean, axis=0) / D

        # pass 2: gradients, and the parameter-gradient partial sums
        row_hash = _row_hash(key_ptr, row, DROPOUT)
        for start in range(0, D, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            mask = cols < D
            x = tl.load(residual_out_ptr + base + cols, mask=mask, other=0.0).to(tl.float32)
            gy = tl.load(grad_out_ptr + base + cols, mask=mask, other=0.0).to(tl.float32)
            w = 0.0
            if HAS_W:
                w = _norm_weight(weight_ptr, cols, mask, LAYER, CAST, OFFSET, W_T, SOFT)
            x_hat, g_hat = _row_grads(x, gy, mean, rstd, w, mask, LAYER, HAS_W)
            g = _input_grad(x_hat, g_hat, c_scale, c_mean, rstd, grad_res_ptr + base, cols, mask, LAYER,
                            HAS_GRAD_RES)
            d_residual = g
            if HAS_SHORTCUT:
                d_residual = g * shortcut_scale
            tl.store(d_residual_ptr + base + cols, _round(d_residual, RES, SOFT), mask=mask)
            if HAS_W:
                _accumulate(dw_part_ptr + part_base + cols,
                            gy * _weight_operand(x_hat, LAYER, CAST, W_HALF, RES, W_T, SOFT), mask)
            if HAS_B:
                _accumulate(db_part_ptr + part_base + cols, gy, mask)
            if SCALE_GRAD:
                _, dropped = _update(branch_ptr + base, branch_bias_ptr, scale_ptr, cols, mask, row_hash, threshold,
                                     keep_scale, scale_const, HAS_BRANCH_BIAS, DROPOUT, SCALE, HAS_CONST, T1, T2,
                                     SOFT)
                _accumulate(dscale_part_ptr + part_base + cols, g * dropped, mask)
            g = _branch_grad(g, scale_ptr, cols, mask, row_hash, threshold, keep_scale, scale_const, SCALE,
                             HAS_CONST, DROPOUT)
            if HAS_BRANCH_BIAS:
                _accumulate(dbb_part_ptr + part_base + cols, g, mask)
            tl.store(d_branch_ptr + base + cols, _round(g, BRANCH_T, SOFT), mask=mask)
