"""The command line: formats, exit codes, the main job."""
from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout

import pytest

from blockir.cli import main
from conftest import EXAMPLES, ROOT

LLAMA = str(ROOT / "examples" / "llama.block")


def run_cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


def test_check_examples_clean() -> None:
    code, _, err = run_cli("check", *(str(p) for p in sorted((ROOT / "examples").glob("*.block"))))
    assert code == 0, err
    assert err.strip().endswith(f"{len(EXAMPLES)} files checked: 0 errors, 0 warnings")


def test_show_ir_is_the_golden() -> None:
    code, out, _ = run_cli("show", LLAMA)
    assert code == 0
    assert out == (ROOT / "tests" / "golden" / "ir" / "llama.ir").read_text()


def test_show_json_is_data() -> None:
    code, out, _ = run_cli("show", LLAMA, "--block", "LlamaDecoderLayer", "--format", "json")
    data = json.loads(out)
    assert code == 0 and data["class"] == "Block" and data["kind"] == "block" and data["name"] == "LlamaDecoderLayer"
    assert [op["class"] for op in data["ops"]] == ["InputOp", "NormOp", "CallOp", "AddOp", "NormOp", "CallOp", "AddOp",
                                                  "OutputOp"]


def test_show_dot_draws_the_residual_spine() -> None:
    code, out, _ = run_cli("show", LLAMA, "--block", "LlamaDecoderLayer", "--format", "dot")
    assert code == 0
    spine = [line.split()[0] for line in out.splitlines() if "group=spine" in line]
    assert spine == ['"x"', '"h"', '"y"']


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz is installed by .ci/run")
def test_dot_renders_with_graphviz() -> None:
    dot = subprocess.run([sys.executable, "-m", "blockir", "show", LLAMA, "--format", "dot"], capture_output=True,
                         check=True, text=True).stdout
    svg = subprocess.run(["dot", "-Tsvg"], input=dot, capture_output=True, check=True, text=True).stdout
    assert svg.count("<svg") == 1 and "self_attn" in svg and "LlamaModel" in svg


def test_unknown_block_is_usage_error() -> None:
    code, _, err = run_cli("show", LLAMA, "--block", "Nope")
    assert code == 2
    assert err.strip() == "blockir: no block named 'Nope' (blocks: LlamaDecoderLayer, LlamaModel)"


def test_usage_errors_exit_2() -> None:
    with pytest.raises(SystemExit) as info, redirect_stderr(io.StringIO()):
        main(["check"])
    assert info.value.code == 2


def test_module_entry_point_and_version() -> None:
    out = subprocess.run([sys.executable, "-m", "blockir", "--version"], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "blockir 0.1.0"


def test_run_prints_loss_and_telemetry_table() -> None:
    code, out, err = run_cli("run", LLAMA, "--steps", "2", "--dims", "B=2,S=8")
    assert code == 0
    progress = err.splitlines()
    assert progress[0].startswith("run LlamaModel: 106,816 parameters, batch 2 x 8 bytes, 2 steps on Python standard "
                                  "library")
    assert progress[1].startswith("step 1/2  loss ") and progress[1].endswith(" tok/s")
    lines = out.splitlines()
    assert lines[0].startswith("train loss ") and " over steps 1-2; validation loss " in lines[0]
    header = lines.index("") + 1
    assert lines[header].startswith("site")
    sites = [line.split()[0] for line in lines[header + 1: header + 5]]
    assert sites == ["layers.0.h", "layers.0.y", "layers.1.h", "layers.1.y"]
    rho_p50, rho_p90, rho_p99 = (float(v) for v in lines[header + 1].split()[1:4])
    assert 0 < rho_p50 <= rho_p90 <= rho_p99


def test_run_binds_stand_ins_for_externs_and_says_so() -> None:
    code, out, err = run_cli("run", str(ROOT / "examples" / "bert.block"), "--dims", "B=2,S=4", "--steps", "1")
    assert code == 0
    assert err.splitlines()[0] == ("blockir: externs replaced by linear stand-ins (a Linear of their first input; "
                                   "bind real modules with blockir.compile): BertLayer.attention.self")
    assert "stand-ins" not in run_cli("run", LLAMA, "--dims", "B=2,S=4")[2]
    # Post-LN: the residual adds are the unnamed sums inside the two LayerNorm calls
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("site"))
    assert [line.split()[0] for line in lines[header + 1: header + 3]] == ["%2", "%6"]


def test_run_plot_writes_a_png(tmp_path) -> None:
    out = tmp_path / "telemetry.png"
    code, _, err = run_cli("run", LLAMA, "--dims", "B=2,S=4", "--plot", str(out))
    assert code == 0 and err.rstrip().endswith(f"wrote {out}")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000


# ---- one rule per convention, for every subcommand ------------------------------------------------------------------

TWO_BLOCKS = str(ROOT / "examples" / "torch_encoder.block")
ONE_BLOCK = str(ROOT / "examples" / "bert.block")
# every subcommand that takes --block, with the arguments it needs besides FILE
BLOCK_COMMANDS = {"show": [], "keys": [], "cost": ["--dims", "B=2,S=4"], "liveness": [], "fold": [],
                  "run": ["--dims", "B=2,S=4"], "recipe": ["rezero"], "diff": [], "plan": ["--tp", "2"]}


def _argv(command: str, path: str, *extra: str) -> list[str]:
    if command == "diff":
        return ["diff", path, path, *extra]
    if command == "recipe":
        return ["recipe", "rezero", path, *extra]
    return [command, path, *BLOCK_COMMANDS[command], *extra]


@pytest.mark.parametrize("command", sorted(BLOCK_COMMANDS))
def test_unknown_block_is_the_same_usage_error_everywhere(command: str) -> None:
    code, out, err = run_cli(*_argv(command, LLAMA, "--block", "Nope"))
    assert (code, out) == (2, "")
    assert err == "blockir: no block named 'Nope' (blocks: LlamaDecoderLayer, LlamaModel)\n"


@pytest.mark.parametrize("command", sorted(set(BLOCK_COMMANDS) - {"show"}))
def test_an_ambiguous_file_asks_for_block(command: str) -> None:
    code, out, err = run_cli(*_argv(command, TWO_BLOCKS))
    assert (code, out) == (2, "")
    assert err == (f"blockir: {TWO_BLOCKS} defines several blocks and no model; choose one with --block (blocks: "
                   "TransformerEncoderLayer, TransformerEncoderLayerNormFirst)\n")


def test_the_default_block_is_the_last_model_else_the_only_block() -> None:
    assert run_cli("keys", LLAMA)[1].startswith("model LlamaModel:\n")
    assert run_cli("keys", ONE_BLOCK)[1].startswith("block BertLayer:\n")
    assert run_cli("cost", LLAMA, "--dims", "B=2,S=4", "--format", "json")[1].count('"LlamaModel"') >= 1


@pytest.mark.parametrize("dims, name", [("D=abc", "dim 'D'"), ("D", "'D'"), ("D=2.5", "dim 'D'"), ("=4", "'=4'")])
@pytest.mark.parametrize("command", ["keys", "cost", "run"])
def test_bad_dims_is_one_usage_error(command: str, dims: str, name: str) -> None:
    err = io.StringIO()
    with pytest.raises(SystemExit) as info, redirect_stderr(err):
        main([command, LLAMA, "--dims", dims])
    assert info.value.code == 2
    assert err.getvalue().splitlines()[-1] == (f"blockir {command}: error: argument --dims: {name}: expected "
                                               f"NAME=INTEGER, got '{dims}'")


def test_parse_dims_reads_integers_and_leaves_values_to_the_layers() -> None:
    from blockir.cli import parse_dims
    assert parse_dims(" B = 2 ,S=16,,D=-4") == {"B": 2, "S": 16, "D": -4}
    assert parse_dims("") == {}


@pytest.mark.parametrize("argv", [["check", LLAMA], ["show", LLAMA], ["keys", LLAMA], ["cost", LLAMA, "--dims", "B=2,S=4"],
                                  ["liveness", LLAMA], ["fold", LLAMA], ["fold", LLAMA, "--apply"], ["diff", LLAMA, LLAMA],
                                  ["recipe", "rezero", LLAMA, "--block", "LlamaDecoderLayer"],
                                  ["run", LLAMA, "--dims", "B=2,S=4"]], ids=lambda a: "-".join(a[:2]).replace("/", ""))
def test_every_report_is_available_as_json(argv: list[str]) -> None:
    code, out, _ = run_cli(*argv, "--format", "json")
    assert code == 0
    json.loads(out)


def test_check_json_locates_every_diagnostic(tmp_path) -> None:
    bad = tmp_path / "bad.block"
    bad.write_text("dim B: batch\ndim D: model = 4\nblock A(x: [B, D]) -> [B, D] {\n  return y\n}\n")
    code, out, err = run_cli("check", str(bad), "--format", "json")
    data = json.loads(out)
    assert code == 1 and data["files"] == 1 and err == "1 file checked: 1 error, 0 warnings\n"
    d = data["diagnostics"][0]
    assert d["location"] == f"{bad}:4:10" and (d["file"], d["line"], d["column"]) == (str(bad), 4, 10)
    assert d["severity"] == "error" and d["code"].startswith("E")


def test_locations_are_file_line_col() -> None:
    rezero = str(ROOT / "examples" / "rezero.block")
    fold = run_cli("fold", LLAMA)[1]
    assert f"  {LLAMA}:29:21  affine   input_layernorm " in fold
    sites = json.loads(run_cli("fold", LLAMA, "--format", "json")[1])[0]["sites"]
    assert sites[0]["location"] == f"{LLAMA}:29:21"
    _, _, log = run_cli("fold", rezero, "--apply")
    sites = [line for line in log.splitlines() if line.startswith("  ") and "nothing to fold" not in line]
    assert len(sites) == 4 and all(line.startswith(f"  {rezero}:16:") or line.startswith(f"  {rezero}:17:")
                                   for line in sites)
    data = json.loads(run_cli("show", LLAMA, "--block", "LlamaDecoderLayer", "--format", "json")[1])
    assert data["ops"][1]["span"] == f"{LLAMA}:29:21"


def test_fold_apply_output_is_a_block_file(tmp_path) -> None:
    code, out, err = run_cli("fold", str(ROOT / "examples" / "rezero.block"), "--apply")
    assert code == 0 and err.startswith("folds of ")
    folded = tmp_path / "folded.block"
    folded.write_text(out)
    assert run_cli("check", str(folded))[0] == 0


def test_fold_apply_pipes_into_check(tmp_path) -> None:
    folded = tmp_path / "g.block"
    shell = (f"{sys.executable} -m blockir fold --apply {LLAMA} > {folded} && "
             f"{sys.executable} -m blockir check {folded}")
    done = subprocess.run(shell, shell=True, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stderr.endswith("1 file checked: 0 errors, 0 warnings\n")


@pytest.mark.parametrize("path", sorted((ROOT / "examples").glob("*.block")), ids=lambda p: p.stem)
def test_show_fuse_prints_a_block_file(path, tmp_path) -> None:
    code, out, _ = run_cli("show", str(path), "--fuse")
    assert code == 0
    printed = tmp_path / "fused.block"
    printed.write_text(out)
    assert run_cli("check", str(printed))[0] == 0


def test_show_fuse_marks_the_fused_op_above_the_ops_it_replaces() -> None:
    lines = run_cli("show", LLAMA, "--fuse", "--block", "LlamaDecoderLayer")[1].splitlines()
    at = lines.index("  # fused (2 ops below): %2, h = fused_add_norm[post_attention_layernorm](branch=%1, shortcut=x)")
    assert lines[at + 1].startswith("  h = x + %1 ") and lines[at + 2].startswith("  %2 = post_attention_layernorm(h) ")


def test_show_block_prints_the_block_with_what_it_calls_as_a_block_file(tmp_path) -> None:
    out = run_cli("show", LLAMA, "--block", "LlamaModel")[1]
    assert out.startswith("dim B: batch\n") and "block LlamaDecoderLayer(" in out and "model LlamaModel(" in out
    printed = tmp_path / "model.block"
    printed.write_text(out)
    assert run_cli("check", str(printed))[0] == 0


def test_dot_is_one_graph_with_a_cluster_per_block() -> None:
    out = run_cli("show", LLAMA, "--format", "dot")[1]
    assert out.endswith("}\n") and out.count("digraph ") == 1
    assert out.count("subgraph cluster_") == 2 and 'label="model LlamaModel";' in out
    single = run_cli("show", LLAMA, "--format", "dot", "--block", "LlamaDecoderLayer")[1]
    assert single.count("digraph ") == 1 and "subgraph" not in single and single.endswith("}\n")


def test_diff_compares_the_default_block_and_what_it_calls() -> None:
    code, out, _ = run_cli("diff", LLAMA, LLAMA)
    assert code == 0
    assert [line for line in out.splitlines() if line.startswith("---")] == [
        f"--- {LLAMA}: block LlamaDecoderLayer", f"--- {LLAMA}: model LlamaModel"]


def test_liveness_covers_the_block_and_what_it_calls() -> None:
    out = run_cli("liveness", LLAMA)[1]
    assert out.startswith("block LlamaDecoderLayer (mode infer)") and "\nmodel LlamaModel (mode infer)" in out
    assert run_cli("liveness", LLAMA, "--block", "LlamaDecoderLayer")[1].count("(mode infer)") == 1


def test_a_file_with_errors_is_diagnosed_with_exit_1(tmp_path) -> None:
    bad = tmp_path / "bad.block"
    bad.write_text("dim B: batch\ndim D: model = 4\nblock A(x: [B, D]) -> [B, D] {\n  return y\n}\n")
    for argv in (["keys", str(bad)], ["show", str(bad)], ["fold", str(bad), "--apply"], ["cost", str(bad)]):
        code, out, err = run_cli(*argv)
        assert (code, out) == (1, "") and err.startswith(f"{bad}:4:10: error[")
    assert run_cli("diff", str(bad), LLAMA)[0] == 2
