"""`blockir lift`: the .block on stdout or in -o, diagnostics in the Python source, exit codes 0/1/2."""
from __future__ import annotations

import io
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

from blockir.cli import main
from conftest import ROOT
from lift_models import one_thread  # noqa: F401  (fixture)

MODELS = ROOT / "tests" / "lift_models"
CLEAN = f"{MODELS / 'clean.py'}"


def _run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(["lift", *argv])
    return code, out.getvalue(), err.getvalue()


def test_a_clean_class_prints_its_block_and_certificate() -> None:
    code, out, err = _run(f"{CLEAN}:RMSPreLN", "--dims", "B=2,S=4,D=32")
    assert code == 0, err
    assert out.startswith("dim B: batch\ndim S: seq\ndim D: model = 32\n")
    assert "  input_norm: rmsnorm(D, eps=1e-06, cast=before_weight)\n" in out
    assert err == "certificate: max relative error 0 (output and every gradient, against the original)\n"


def test_constructor_arguments_and_output_file(tmp_path: Path) -> None:
    target = tmp_path / "stack.block"
    code, out, err = _run(f"{CLEAN}:Stack", "--args", '{"layers": 2}', "--dims", "D=32", "-o", str(target))
    assert code == 0, err
    assert out == ""
    assert "  layers: RMSPreLN * 2\n" in target.read_text()
    code, _, err = _run(f"{CLEAN}:Stack", "--dims", "D=32", "-o", str(target))
    assert code == 2 and f"{target} exists; pass --force to replace it" in err
    assert "layers: RMSPreLN * 2" in target.read_text()


def test_a_bug_exits_1_with_the_python_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(ROOT / "tests"))
    code, out, err = _run(f"{MODELS / 'buggy.py'}:DropoutAfterAdd", "--dims", "D=32")
    assert code == 1
    assert "buggy.py:22:9: error[E0402]: dropout after the residual add drops the updated state" in err
    assert "      return self.drop(x + self.attn(self.ln(x)))  # expect: E0402\n" in err
    assert "Traceback" not in err and "certificate" not in err


@pytest.mark.parametrize("argv, message", [
    (["nowhere.py:Block"], "cannot read nowhere.py"),
    ([f"{CLEAN}:Missing"], "defines no nn.Module class 'Missing'"),
    (["clean:Block"], "expected PATH.py:ClassName or 'hf MODEL_TYPE'"),
    ([f"{CLEAN}:PreLN", "--args", "{"], "--args is not JSON"),
    (["hf"], "blockir lift hf needs a MODEL_TYPE"),
    (["hf", "no_such_family"], "no transformers family 'no_such_family'"),
])
def test_usage_errors_exit_2(argv: list[str], message: str) -> None:
    code, _, err = _run(*argv)
    assert code == 2 and message in err, err


def test_a_constructor_that_fails_is_a_diagnostic() -> None:
    code, _, err = _run(f"{CLEAN}:Stack", "--args", '{"depth": 2}')
    assert code == 1
    assert "error[E0910]: Stack(*[], **{'depth': 2}) fails: TypeError" in err


def test_hf_lifts_the_first_layer_of_a_tiny_family() -> None:
    code, out, err = _run("hf", "llama", "--dims", "S=4")
    assert code == 0, err
    assert "block LlamaDecoderLayer(hidden_states: [B, S, D]) -> [B, S, D] {" in out
    assert "certificate: max relative error 0" in err
