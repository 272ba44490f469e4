"""An extern fused add+norm with a declared contract: what check reads from it, and what diverge measures."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import blockir
from blockir.analyses.manifest import program_manifest
from blockir.analyses.sizes import Sizes
from blockir.cli import main
from blockir.ir.printer import format_program
from blockir.lifecycle.diverge import POLICIES
from blockir.lifecycle.extern_norms import check_contract, contract_diagnostic
from extern_norm_impls import (Bf16StatisticsAddRMSNorm, DetachedStatisticsAddRMSNorm, Float64AddRMSNorm,
                               FusedAddRMSNorm, ResidualFirstAddRMSNorm)

IMPLS = Path(__file__).with_name("extern_norm_impls.py")
D = 16
TEXT = """dim B: batch
dim S: seq
dim D: model = 16
dim F: hidden = 32

block L(x: [B, S, D]) -> [B, S, D] {
  ln_1: rmsnorm(D, eps=1e-6)
  attn: self_attention(heads=2)
  add_norm: extern(x: [B, S, D], residual: [B, S, D]; norm=rmsnorm(D, eps=1e-6), residual=1) -> ([B, S, D], [B, S, D])
  mlp: gated_mlp(F)
  n, h = add_norm(attn(ln_1(x)), x)
  y = h + mlp(n)
  return y
}
"""


def _errors(text: str) -> list[tuple[str, str, int]]:
    try:
        program = blockir.parse(text, "t.block")
    except blockir.BlockError as exc:
        return [(d.code, d.message, d.span.line) for d in exc.diagnostics]
    return [(d.code, d.message, d.span.line) for d in blockir.verify(program) if d.is_error]


def test_the_contract_checks_clean_and_reads_as_an_update_whose_residual_is_the_stream() -> None:
    program = blockir.parse(TEXT, "t.block")
    assert [d for d in blockir.verify(program) if d.is_error or d.severity == "warning"] == []
    assert blockir.parse(format_program(program), "again.block").block("L").decls == program.block("L").decls
    block = program_manifest(program)["blocks"]["L"]
    assert block["topology"] == "pre_ln" and "from_norm" not in block["residual"]
    # the update the extern closes, with its norm the next branch's pre-norm, as a fused add+norm's
    assert [(n["name"], n["family"], n["placement"], n["epsilon"]) for n in block["norm_sites"]] == [
        ("ln_1", "rmsnorm", "pre_branch", 1e-6), ("add_norm", "rmsnorm", "pre_branch", 1e-6)]


def test_the_normalized_result_continuing_the_stream_is_reported() -> None:
    message = ("the shortcut of this add is 'n', the normalized output of 'add_norm': the residual stream continues "
               "from a normalized value")
    assert _errors(TEXT.replace("y = h + mlp(n)", "y = n + mlp(n)")) == [("E0412", message, 12)]
    # the residual=0 order names the other result the sum
    swapped = TEXT.replace("residual=1)", "residual=0)")
    assert _errors(swapped) == [("E0412", message.replace("'n'", "'h'").replace("of 'add_norm'", "of 'add_norm'"),
                                 12)]
    assert _errors(swapped.replace("n, h = add_norm", "h, n = add_norm")) == []


@pytest.mark.parametrize("contract, code, message", [
    ("norm=rmsnorm(D)", "E0454", "extern 'add_norm' is a fused add+norm: residual=0 or residual=1 must say which "
                                 "result is the sum that continues the stream"),
    ("norm=linear(D, D), residual=1", "E0454", "the norm of extern 'add_norm' must be a built-in norm, as in "
                                               "norm=rmsnorm(D)"),
    ("norm=rmsnorm(F), residual=1", "E0454", "extern 'add_norm' states it computes rmsnorm over F, but its signature "
                                             "has the axes [B, S, D]"),
    ("norm=batchnorm(D, padding=mask), residual=1", "E0454", "extern 'add_norm' states batchnorm, which takes its "
                                                             "moments over the rows of a batch; a fused add+norm "
                                                             "normalizes each row by its own statistics"),
    ("residual=1", "E0105", "the contract of extern 'add_norm' names no norm"),
    ("norm=rmsnorm(D), stats=f32", "E0104", "unknown term 'stats' in the contract of extern 'add_norm'"),
    # the norm verifier holds the stated norm to its family's contract
    ("norm=rmsnorm(D, partial=1.5), residual=1", "E0470", "rmsnorm 'add_norm' has partial=1.5: the share of the "
                                                           "features its RMS is estimated from must be in (0, 1]"),
])
def test_a_contract_that_does_not_fit_is_reported(contract: str, code: str, message: str) -> None:
    text = TEXT.replace("norm=rmsnorm(D, eps=1e-6), residual=1", contract)
    assert _errors(text) == [(code, message, 9)]


def test_several_results_need_a_contract() -> None:
    text = TEXT.replace("; norm=rmsnorm(D, eps=1e-6), residual=1", "")
    assert _errors(text) == [("E0454", "extern 'add_norm' returns 2 results but states no contract: only a fused "
                                       "add+norm returns several", 9)]


def _reference(x: torch.Tensor, p: dict[str, torch.Tensor]) -> torch.Tensor:
    """The block from its equations in float64, with the extern's add+RMSNorm written out."""
    def rms(v: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return w * v / torch.sqrt(v.pow(2).mean(-1, keepdim=True) + 1e-6)
    a = rms(x, p["ln_1.weight"])
    b, s, _ = a.shape
    q, k, v = (torch.nn.functional.linear(a, p[f"attn.{n}_proj.weight"]).view(b, s, 2, D // 2).transpose(1, 2)
               for n in "qkv")
    o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, D)
    h = torch.nn.functional.linear(o, p["attn.o_proj.weight"]) + x
    n = rms(h, p["add_norm.weight"])
    lin = torch.nn.functional.linear
    mlp = lin(torch.nn.functional.silu(lin(n, p["mlp.gate_proj.weight"])) * lin(n, p["mlp.up_proj.weight"]),
              p["mlp.down_proj.weight"])
    return h + mlp


def test_a_bound_fused_add_norm_computes_the_block() -> None:
    from oracle import assert_matches_reference
    exact = blockir.parse(TEXT.replace("eps=1e-6)", "eps=1e-6, accum=f64)"))
    m = blockir.compile(exact, "L", seed=0, dtype=torch.float64, bind={"add_norm": Float64AddRMSNorm(D)})
    assert_matches_reference(m, _reference, (2, 3, D))
    program = blockir.parse(TEXT)
    one = blockir.compile(program, "L", seed=0, bind={"add_norm": (FusedAddRMSNorm(D), lambda mod, x, r: x)})
    with pytest.raises(blockir.BlockError) as info:
        one(torch.randn(2, 3, D))
    assert [d.message for d in info.value.diagnostics] == [
        "extern 'add_norm' returned a Tensor, expected a tuple of 2 tensors"]


def _decl():
    program = blockir.parse(TEXT)
    return program.block("L").decl_map["add_norm"], Sizes.of(program, {"B": 2, "S": 5})


def test_a_correct_implementation_meets_the_contract_exactly() -> None:
    decl, sizes = _decl()
    checks = check_contract(decl, FusedAddRMSNorm(D), sizes, POLICIES["fp32"], seed=3)
    assert [(c.role, c.index, c.max_error, c.passed) for c in checks] == [
        ("normalized", 0, 0.0, True), ("residual", 1, 0.0, True), ("d/dx", None, 0.0, True),
        ("d/dresidual", None, 0.0, True), ("d/dweight", None, 0.0, True)]
    assert contract_diagnostic(decl, "impl", checks, POLICIES["fp32"]) is None


def test_a_wrong_backward_under_a_right_forward_fails_on_the_gradients() -> None:
    decl, sizes = _decl()
    checks = check_contract(decl, DetachedStatisticsAddRMSNorm(D), sizes, POLICIES["fp32"], seed=3)
    assert [(c.role, c.passed) for c in checks] == [("normalized", True), ("residual", True), ("d/dx", False),
                                                    ("d/dresidual", False), ("d/dweight", True)]
    assert checks[0].max_error < 1e-6 and checks[2].max_error > 1e-2
    found = contract_diagnostic(decl, "impl", checks, POLICIES["fp32"])
    assert found.hint == "the forward agrees and the backward does not: check the module's gradient"


def test_results_in_the_other_order_fail_and_are_named_swapped() -> None:
    decl, sizes = _decl()
    module = ResidualFirstAddRMSNorm(D)
    checks = check_contract(decl, module, sizes, POLICIES["fp32"], seed=3)
    gen = torch.Generator().manual_seed(3)
    gen_state = {"weight": torch.ones(D) + 0.25 * torch.randn(D, generator=gen)}
    x, r = torch.randn(2, 5, D, generator=gen), torch.randn(2, 5, D, generator=gen)
    total = (x + r).double()
    normalized = gen_state["weight"].double() * total / torch.sqrt(total.pow(2).mean(-1, keepdim=True) + 1e-6)
    assert torch.equal(module.weight.detach(), gen_state["weight"])
    assert [c.passed for c in checks] == [False] * 5
    assert checks[0].max_error == pytest.approx(float((total - normalized).abs().max()), rel=1e-5)
    found = contract_diagnostic(decl, "impl", checks, POLICIES["fp32"])
    assert (found.code, found.span.line, found.hint) == (
        "E0455", 9, "the module returns the two results in the other order: its residual is at position 0; declare "
                    "residual=0 or fix the module")


def test_statistics_in_bf16_under_an_f32_contract_fail_on_the_normalized_result() -> None:
    decl, sizes = _decl()
    checks = check_contract(decl, Bf16StatisticsAddRMSNorm(D), sizes, POLICIES["fp32"], seed=3)
    assert [c.passed for c in checks] == [False, True, False, False, False]
    assert 1e-3 < checks[0].max_error < 1e-1 and checks[1].max_error == 0.0
    assert contract_diagnostic(decl, "impl", checks, POLICIES["fp32"]).message.startswith(
        f"extern 'add_norm' bound to impl does not compute its contract (fp32 policy): result 0 (normalized) differs "
        f"by max {checks[0].max_error:.3g} > {checks[0].bound:.3g}; the gradient d/dx differs by max ")


def test_diverge_bind_reports_each_result_and_fails_located(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = tmp_path / "t.block"
    path.write_text(TEXT)
    assert main(["diverge", str(path), "--bind", f"add_norm={IMPLS}:FusedAddRMSNorm", "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["externs"][0]["reference"] == "rmsnorm(D)"
    assert [(r["role"], r["index"], r["max_error"], r["passed"]) for r in report["externs"][0]["results"]][:2] == [
        ("normalized", 0, 0.0, True), ("residual", 1, 0.0, True)]
    assert main(["diverge", str(path), "--bind", f"add_norm={IMPLS}:Bf16StatisticsAddRMSNorm"]) == 1
    out = capsys.readouterr()
    assert "  result 1 (residual): max error 0.000e+00" in out.out
    assert out.err.startswith(f"{path}:9:3: error[E0455]: extern 'add_norm' bound to {IMPLS}:Bf16StatisticsAddRMSNorm "
                              "does not compute its contract (fp32 policy): result 0 (normalized) differs by max ")
    assert main(["diverge", str(path), "--bind", f"mlp={IMPLS}:FusedAddRMSNorm"]) == 2
    assert capsys.readouterr().err == "blockir: 'mlp' is no extern norm of L (extern norms: add_norm)\n"
