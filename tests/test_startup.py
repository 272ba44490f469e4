"""Start-up: the checking commands never import torch; the parser tables come from a disk cache."""
from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from conftest import ROOT

LLAMA = str(ROOT / "examples" / "llama.block")
# runs the command in-process, then reports which heavy libraries it imported
RUNNER = """
import sys
from blockir.cli import main
code = main(sys.argv[1:])
print(" ".join(sorted(m for m in ("torch", "triton") if m in sys.modules)), file=sys.stderr)
raise SystemExit(code)
"""
COMMANDS = {
    "check": ["check", LLAMA],
    "show": ["show", LLAMA, "--fuse"],
    "show-dot": ["show", LLAMA, "--format", "dot"],
    "show-manifest": ["show", LLAMA, "--format", "manifest"],
    "keys": ["keys", LLAMA],
    "cost": ["cost", LLAMA, "--dims", "B=2,S=4"],
    "liveness": ["liveness", LLAMA],
    "fold": ["fold", LLAMA],
    "fold-apply": ["fold", LLAMA, "--apply"],
    "diff": ["diff", LLAMA, LLAMA],
    "recipe": ["recipe", "rezero", LLAMA, "--block", "LlamaDecoderLayer"],
}


@pytest.mark.parametrize("argv", COMMANDS.values(), ids=COMMANDS.keys())
def test_checking_commands_never_import_torch(argv: list[str]) -> None:
    done = subprocess.run([sys.executable, "-c", RUNNER, *argv], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines()[-1] == ""


def test_import_blockir_is_torch_free_and_compile_loads_on_first_use() -> None:
    code = ("import sys, blockir; before = 'torch' in sys.modules; f = blockir.compile; "
            "print(before, 'torch' in sys.modules, f.__module__, sorted(set(blockir.__all__) - set(dir(blockir))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT).stdout
    assert out.split(maxsplit=3) == ["False", "True", "blockir.backends.compile", "[]\n"]


def test_grammar_cache_is_written_once_and_reused(tmp_path: Path) -> None:
    env_code = ("import blockir; blockir.parse(open(%r).read()); "
                "from blockir.grammar.cache import cache_dir; print(cache_dir())") % LLAMA
    env = {"BLOCKIR_CACHE_DIR": str(tmp_path / "cache"), "PATH": "/usr/bin:/bin"}
    for _ in range(2):
        out = subprocess.run([sys.executable, "-c", env_code], capture_output=True, text=True, check=True, cwd=ROOT,
                             env={**env, "PYTHONPATH": str(ROOT)}).stdout
        assert out.strip() == str(tmp_path / "cache")
        assert [p.suffix for p in (tmp_path / "cache").iterdir()] == [".pickle"]


def test_a_corrupt_or_unwritable_cache_only_costs_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from blockir.grammar import cache
    from blockir.grammar.parser import _lark
    grammar = "start: \"a\"+\n"
    monkeypatch.setenv(cache.ENV, str(tmp_path))
    cache.cached_lark(grammar, parser="lalr")
    [stored] = tmp_path.iterdir()
    stored.write_bytes(b"not a pickle")
    assert cache.cached_lark(grammar, parser="lalr").parse("aa").data == "start"
    blocked = tmp_path / "file"
    blocked.write_text("")
    monkeypatch.setenv(cache.ENV, str(blocked / "sub"))  # a directory below a file cannot be made
    assert cache.cached_lark(grammar, parser="lalr").parse("a").data == "start"
    monkeypatch.setenv(cache.ENV, "")
    assert cache.cache_dir() is None
    assert _lark() is _lark()


def test_without_triton_the_fused_ops_warn_once_and_use_the_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    from blockir.backends import fused
    from blockir.backends.fused import ops, reference
    monkeypatch.setitem(sys.modules, "triton", None)  # what an install without the extra looks like
    monkeypatch.delitem(sys.modules, "blockir.backends.fused.kernels", raising=False)
    monkeypatch.delattr(fused, "kernels", raising=False)
    ops.triton_kernels.cache_clear()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            spec = ops._spec_rms(1e-6, 0, "before_weight", 0.0, False, 1.0, 1.0, None, ops.torch.float32)
            assert ops._cuda_impl(spec) is reference and ops._cuda_impl(spec) is reference
        assert [str(w.message) for w in caught] == [
            "triton is not installed: the fused ops run their PyTorch reference path on CUDA (install the Triton "
            "kernels with: pip install 'blockir[triton]')"]
    finally:
        ops.triton_kernels.cache_clear()
