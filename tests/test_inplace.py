"""mode="infer": residual adds write over the shortcut's buffer where the liveness plan allows."""
from __future__ import annotations

import torch

import blockir
from blockir.lower.fx import inplace_add
from blockir.lower.memory import peak_bytes
from conftest import ROOT

LLAMA = ROOT / "examples" / "llama.block"


def _pair():
    infer = blockir.compile(LLAMA, "LlamaModel", seed=0, mode="infer").eval()
    train = blockir.compile(LLAMA, "LlamaModel", seed=0).eval()
    return infer, train


def test_outputs_equal_and_storage_shared_where_planned() -> None:
    infer, train = _pair()
    x = torch.randn(2, 5, 64)
    with torch.no_grad():
        y_ref, ref = blockir.trace(train, x)
        y, vals = blockir.trace(infer, x)
    assert torch.equal(y, y_ref)
    ptr = {k: v.data_ptr() for k, v in vals.items()}
    # layer 1 receives layer 0's output as a donated buffer: both adds write over it
    assert ptr["layers.1.x"] == ptr["layers.1.h"] == ptr["layers.1.y"]
    # layer 0's input is the caller's tensor: its first add allocates, its second writes over h
    assert ptr["layers.0.h"] != ptr["layers.0.x"] and ptr["layers.0.h"] == ptr["layers.0.y"]
    # out of place, every residual state has its own storage
    assert len({ref[k].data_ptr() for k in ("layers.0.h", "layers.0.y", "layers.1.h", "layers.1.y")}) == 4


def test_caller_input_is_never_overwritten() -> None:
    infer, _ = _pair()
    x = torch.randn(2, 5, 64)
    before = x.clone()
    with torch.inference_mode():
        infer(x)
    assert torch.equal(x, before)


def test_train_mode_compiles_no_inplace_add() -> None:
    _, train = _pair()
    code = "".join(train.get_submodule(f"layers.{i}").code for i in range(2))
    assert "inplace_add" not in code


def test_inference_module_stays_correct_with_autograd_on() -> None:
    infer, train = _pair()
    x = torch.randn(2, 5, 64, requires_grad=True)
    (g_infer,) = torch.autograd.grad(infer(x).sum(), x)
    (g_train,) = torch.autograd.grad(train(x).sum(), x)
    torch.testing.assert_close(g_infer, g_train, rtol=0, atol=0)


def test_inplace_add_writes_into_target_only_without_grad() -> None:
    a, b = torch.ones(3), torch.full((3,), 2.0)
    with torch.no_grad():
        out = inplace_add(a, b)
    assert out.data_ptr() == a.data_ptr() and torch.equal(a, torch.full((3,), 3.0))
    c = torch.ones(3)
    assert inplace_add(c, b).data_ptr() != c.data_ptr()


def test_live_bytes_counts_peak_of_new_storages() -> None:
    x = torch.randn(1000)  # 4,000 bytes, existed before: not counted

    def f() -> torch.Tensor:
        y = x + 1          # +4,000
        z = y * 2          # +4,000 → 8,000 live
        del y              # -4,000
        z.add_(1)          # in place: nothing new
        return z + 3       # +4,000 → 8,000 live

    assert peak_bytes(f, (x,)) == 8000


def test_inplace_lowering_reduces_peak_memory() -> None:
    infer, train = _pair()
    x = torch.randn(2, 5, 64)
    with torch.inference_mode():
        out_of_place = peak_bytes(lambda: train(x), (x, *train.parameters()))
        in_place = peak_bytes(lambda: infer(x), (x, *infer.parameters()))
    assert in_place < out_of_place
