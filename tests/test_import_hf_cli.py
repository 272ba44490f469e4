"""`blockir import hf` on what a careless or hostile user gives it: located errors with exit 1 and no traceback,
nothing written on failure, atomic output that replaces a file only with --force; and the `.block` verifier's own
bounds on attention dropout and rotary dims."""
from __future__ import annotations

import io
import json
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

import blockir
from blockir.cli import main
from blockir.api import hf_block_text as block_text
from hf_configs import CONFIGS


def _run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(["import", "hf", *argv])
    return code, out.getvalue(), err.getvalue()


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("name, content, expected", [
    ("missing.json", None, "missing.json: error[E0805]: cannot read the config: No such file or directory"),
    ("empty", "folder", "empty/config.json: error[E0805]: the folder holds no config.json"),
    ("big.json", b"{" + b" " * (4 << 20) + b"}", "big.json: error[E0805]: the config is larger than 4 MiB"),
    ("latin1.json", b'{"model_type": "caf\xe9"}', "latin1.json:1:20: error[E0806]: the config is not UTF-8 text "
                                                  "(byte 0xe9)"),
    ("syntax.json", b'{"model_type": "llama",\n  "x": }', "syntax.json:2:8: error[E0806]: the config is not JSON: "
                                                         "Expecting value"),
    ("deep.json", b"[" * 100_000, "deep.json: error[E0806]: the config is not JSON blockir can read: brackets nest "
                                  "too deep"),
    ("nested.json", json.dumps({"model_type": "llama", "id2label": [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}).encode(),
     "nested.json: $.id2label[0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0]"
     "[0][0]: error[E0806]: the config nests deeper than 32 levels"),
    ("list.json", b"[1, 2]", "list.json: $: error[E0806]: a config is a JSON object, got list"),
    ("digits.json", b'{"hidden_size": ' + b"9" * 5000 + b"}", "digits.json: error[E0806]: the config is not JSON "
                                                             "blockir can read: Exceeds the limit (4300 digits) for integer string conversion: "
                                                             "value has 5000 digits"),
    ("bad.json", json.dumps(dict(CONFIGS["llama"], rms_norm_eps=float("nan"), num_key_value_heads="2",
                                 rope_scaling={"rope_type": "linear", "factor": 2, "bogus": 1})).encode(),
     "bad.json: $.num_key_value_heads: error[E0807]: num_key_value_heads must be a positive integer, got '2'"),
])
def test_bad_input_is_a_located_error_and_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str,
                                                         content: bytes | str | None, expected: str) -> None:
    monkeypatch.chdir(tmp_path)
    if content == "folder":
        Path(name).mkdir()
    elif content is not None:
        Path(name).write_bytes(content)  # type: ignore[arg-type]
    before = _snapshot(tmp_path)
    code, out, err = _run(name, "-o", "out.block")
    assert (code, out) == (1, "")
    assert err.splitlines()[0] == expected
    assert "Traceback" not in err
    assert _snapshot(tmp_path) == before


def test_every_problem_of_a_config_is_reported_at_its_field(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(dict(CONFIGS["llama"], rms_norm_eps=-1, num_key_value_heads="2", num_hidden_layers=10 ** 9,
                                    rope_scaling={"rope_type": "linear", "factor": 2, "bogus": 1})))
    with pytest.raises(blockir.BlockError) as info:
        block_text(json.loads(path.read_text()), source=str(path))
    assert [(str(d.span), d.code) for d in info.value.diagnostics] == [  # in the config's order
        (f"{path}: $.num_hidden_layers", "E0808"), (f"{path}: $.num_key_value_heads", "E0807"),
        (f"{path}: $.rms_norm_eps", "E0808"), (f"{path}: $.rope_scaling.bogus", "E0810")]


def test_a_folder_imports_its_config_and_the_output_is_replaced_only_with_force(tmp_path: Path) -> None:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(CONFIGS["llama"]))
    out = tmp_path / "llama.block"
    assert _run(str(folder), "-o", str(out))[0] == 0
    assert out.read_text() == block_text(CONFIGS["llama"])
    out.write_text("# mine\n")
    code, _, err = _run(str(folder), "-o", str(out))
    assert code == 1 and err.startswith(f"{out}: error[E0815]: {out} exists")
    assert out.read_text() == "# mine\n"
    assert _run(str(folder), "-o", str(out), "--force")[0] == 0
    assert out.read_text() == block_text(CONFIGS["llama"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["llama.block", "model"]  # no temporary file left
    code, _, err = _run(str(folder), "-o", str(tmp_path))
    assert code == 1 and f"error[E0815]: {tmp_path} is a folder" in err


def test_stdout_is_the_file_and_it_checks_clean(tmp_path: Path) -> None:
    (tmp_path / "c.json").write_text(json.dumps(CONFIGS["gemma3_text"]))
    code, out, _ = _run(str(tmp_path / "c.json"))
    assert code == 0
    assert [d for d in blockir.verify(blockir.parse(out, "x.block")) if d.is_error] == []


@pytest.mark.parametrize("args, code, message", [
    ("heads=4, dropout=1.5", "E0816", "dropout of 'attn' must lie in [0, 1), got 1.5"),
    ("heads=4, dropout=-0.1", "E0816", "dropout of 'attn' must lie in [0, 1), got -0.1"),
    ("heads=4, rope=true, rotary_dim=18", "E0817", "rotary_dim of 'attn' must be an even integer from 0 to its "
                                                   "head_dim 16, got 18"),
    ("heads=4, rope=true, rotary_dim=7", "E0817", "rotary_dim of 'attn' must be an even integer from 0 to its "
                                                  "head_dim 16, got 7"),
    ("heads=4, rope=true, rotary_dim=-2", "E0817", "rotary_dim of 'attn' must be an even integer from 0 to its "
                                                   "head_dim 16, got -2"),
])
def test_the_verifier_bounds_attention_dropout_and_rotary_dims(args: str, code: str, message: str) -> None:
    text = (f"dim B: batch\ndim S: seq\ndim D: model = 64\nblock Layer(x: [B, S, D]) -> [B, S, D] {{\n"
            f"  attn: self_attention({args})\n  h = x + attn(x)\n  return h\n}}\n")
    found = [d for d in blockir.verify(blockir.parse(text, "f.block")) if d.is_error]
    assert [(d.code, d.message, str(d.span)) for d in found] == [(code, message, "f.block:5:3")]


def test_a_drop_probability_in_layer_is_checked_in_every_layer() -> None:
    text = ("dim B: batch\ndim S: seq\ndim D: model = 8\nblock Layer(x: [B, S, D]) -> [B, S, D] {\n"
            "  f: linear(D, D)\n  h = x + dropout(f(x), p=0.6 * layer)\n  return h\n}\n"
            "model M(x: [B, S, D]) -> [B, S, D] {\n  layers: Layer * 3\n  return layers(x)\n}\n")
    (d,) = [d for d in blockir.verify(blockir.parse(text, "f.block")) if d.is_error]
    assert (d.code, d.message, str(d.span), d.notes[0].message) == (
        "E0816", "drop probability must lie in [0, 1), got 1.2", "f.block:6:11", "in layer 2 of 3")


DIAGNOSTICS = (Path(__file__).parents[1] / "docs" / "diagnostics.md").read_text()


def test_every_importer_code_is_documented() -> None:
    import re
    root = Path(__file__).parents[1] / "blockir"
    sources = list(root.rglob("*.py"))  # the importer's codes and the model-folder codes that share the range
    emitted = {c for p in sources for c in re.findall(r"""["'](E08\d\d)["']""", p.read_text())}
    documented = set(re.findall(r"^## (E08\d\d) ", DIAGNOSTICS, re.M))
    assert emitted == documented, (sorted(emitted - documented), sorted(documented - emitted))


@pytest.mark.parametrize("code", ["E0816", "E0817"])
def test_the_verifier_examples_render_as_documented_and_the_fix_is_clean(code: str) -> None:
    import re
    from blockir.diagnostics import render
    body = DIAGNOSTICS.split(f"## {code} ")[1].split("\n## ")[0]
    wrong, shown, fixed = re.findall(r"^```\w+\n(.*?)^```$", body, re.M | re.S)
    found = [d for d in blockir.verify(blockir.parse(wrong, "example.block")) if d.is_error]
    assert "\n".join(render(d, {"example.block": wrong}) for d in found) == shown.rstrip("\n")
    assert [d for d in blockir.verify(blockir.parse(fixed, "example.block")) if d.is_error] == []


def test_the_import_and_its_check_need_neither_torch_nor_transformers() -> None:
    import subprocess
    import sys
    root = Path(__file__).parents[1]
    code = ("import sys; from hf_configs import CONFIGS; from blockir.api import hf_block_text as block_text; "
            "block_text(CONFIGS['llama']); print('torch' in sys.modules, 'transformers' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": f"{root}:{root / 'tests'}", "PATH": ""}, cwd=root)
    assert out.stdout.split() == ["False", "False"]


def test_a_written_file_that_fails_its_check_is_an_internal_error_and_not_returned(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from blockir.importers.hf import writer as hf
    write = hf.WRITERS["llama"]
    monkeypatch.setitem(hf.WRITERS, "llama", lambda c, t, e: write(c, t, e).replace("heads=4", "heads=3", 1))
    with pytest.raises(blockir.BlockError) as info:
        block_text(CONFIGS["llama"], source="config.json")
    (d,) = info.value.diagnostics
    assert (d.code, str(d.span)) == ("E0814", "config.json: $")
    assert d.message == ("the file written for this config fails its own check: error[E0210] kv_heads=2 of "
                         "'self_attn' does not divide heads=3")
