"""Start-up: the checking commands never import torch; the parser tables ship with the package as data."""
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


def test_check_imports_only_the_stages_it_runs() -> None:
    """Reading, typing and verifying: no lowering, rewriting, reporting, importing or lifting module loads."""
    runner = RUNNER.replace('print(" ".join(sorted(m for m in ("torch", "triton") if m in sys.modules)), file=sys.stderr)',
                            'print(" ".join(sorted({m.split(".")[1] for m in sys.modules if m.startswith("blockir.")})), '
                            'file=sys.stderr)')
    done = subprocess.run([sys.executable, "-c", runner, "check", LLAMA], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines()[-1].split() == ["analyses", "api", "cli", "collector", "commands", "diagnostics",
                                                    "frontend", "ir", "lifecycle", "norms", "ops", "signatures", "verifiers"]


def _parse_all(texts: list[tuple[str, str]]) -> list[str]:
    from blockir.diagnostics import BlockError
    from blockir.frontend import parser
    out = []
    for name, text in texts:
        try:
            out.append(repr(parser.parse_ast(text, name)))
        except BlockError as exc:
            out.append(repr([(d.code, d.message, d.span) for d in exc.diagnostics]))
    return out


def test_the_shared_scanner_lexes_as_larks_contextual_lexer(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every example, and damaged copies of them, give the same tree or the same diagnostics with lark's own
    contextual lexer; a parse of llama.block compiles two scanners instead of one per parser state met."""
    from blockir.frontend import parser, tables
    texts = [(str(p), p.read_text()) for p in sorted((ROOT / "examples").glob("*.block"))[:24]]
    body = [(name, text, text.index("{")) for name, text in texts[:12]]
    damaged = [(f"{name}@{i}", text[:i] + text[i + 1:]) for name, text, i in body]  # the first block's '{'
    damaged += [(f"{name}#{i}", text[:i + 12]) for name, text, i in body]
    damaged += [(f"{name}:{i}", text[:i] + ") ]" + text[i:]) for name, text, i in body]
    damaged += [(name, text.replace("(", "(,", 2)) for name, text, _ in body]
    parser._lark.cache_clear()
    shared = _parse_all(texts + damaged)
    parser._lark.cache_clear()
    parser.parse_ast((ROOT / "examples" / "llama.block").read_text(), LLAMA)
    lexer = parser._lark().parser.lexer
    compiled = {id(x) for x in [lexer.root_lexer, *lexer.lexers.values()] if x._scanner is not None}
    assert len(compiled) == 2
    monkeypatch.setattr(tables, "PLUGINS", {})
    parser._lark.cache_clear()
    try:
        assert _parse_all(texts + damaged) == shared
        assert sum(r.startswith("[(") for r in shared) >= len(damaged) // 2  # the damaged ones exercise errors
    finally:
        monkeypatch.undo()
        parser._lark.cache_clear()


def test_the_collector_pause_ages_what_it_allocated_and_leaves_frozen_objects_frozen() -> None:
    import gc

    from blockir.collector import gc_paused
    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
        made = [[] for _ in range(3)]
    assert gc.isenabled()
    assert any(o is made[0] for o in gc.get_objects(2))  # moved to the oldest generation, not scanned
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        with gc_paused():
            [[] for _ in range(3)]
        # still frozen (a freeze-unfreeze cycle would empty the permanent generation); objects other threads
        # free meanwhile may leave it, none joins it
        assert gc.isenabled() and 0 < gc.get_freeze_count() <= frozen
    finally:
        gc.unfreeze()


def test_import_blockir_is_torch_free_and_compile_loads_on_first_use() -> None:
    code = ("import sys, blockir; before = 'torch' in sys.modules; f = blockir.compile; "
            "print(before, 'torch' in sys.modules, f.__module__, sorted(set(blockir.__all__) - set(dir(blockir))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT).stdout
    assert out.split(maxsplit=3) == ["False", "True", "blockir.lower.compile", "[]\n"]


def test_the_shipped_tables_are_a_fresh_build_of_the_grammar() -> None:
    """A grammar edit without regenerating fails here; the build does not depend on string hashing."""
    from blockir.frontend import tables
    shipped = (ROOT / "blockir" / "frontend" / tables.TABLES_FILE).read_bytes()
    assert tables.render(tables.grammar_text()).encode() == shipped
    other_seed = subprocess.run([sys.executable, "-c", "import sys; from blockir.frontend import tables; "
                                 "sys.stdout.write(tables.render(tables.grammar_text()))"], capture_output=True,
                                check=True, cwd=ROOT, env={"PYTHONHASHSEED": "12345", "PYTHONPATH": str(ROOT)}).stdout
    assert other_seed == shipped


def test_tables_from_another_grammar_lark_or_a_damaged_file_are_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    from blockir.frontend import tables
    grammar, text = tables.grammar_text(), tables.shipped_text()
    assert text is not None and tables._parse_tables(text, grammar) is not None
    head, _, body = text.partition("\n")
    edited = grammar.replace('"const" NAME', '"constant" NAME')
    assert edited != grammar and tables._parse_tables(text, edited) is None
    assert tables._parse_tables(text[: len(text) // 2], grammar) is None  # truncated
    assert '"WS"' in body
    assert tables._parse_tables(head + "\n" + body.replace('"WS"', '"WX"'), grammar) is None  # foreign tables
    assert tables._parse_tables(head.replace(tables.lark.__version__, "0.0.0") + "\n" + body, grammar) is None
    assert tables._parse_tables("not json\n{}\n", grammar) is None
    # ignored means built from the grammar: the parse is the same as with good tables
    monkeypatch.setattr(tables, "shipped_text", lambda: text[:-100])
    built = tables.load_lark()
    monkeypatch.undo()
    loaded = tables.load_lark()
    program = (ROOT / "examples" / "llama.block").read_text()
    assert built.parse(program) == loaded.parse(program)


class _Planted:
    """Unpickling this writes a marker file: what a planted cache file would do to a reader that unpickles it."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (Path.write_text, (self.marker, "code ran"))


def test_a_planted_pickle_in_any_cache_folder_is_never_loaded(tmp_path: Path) -> None:
    import hashlib
    import pickle

    import lark

    from blockir.frontend import tables
    marker = tmp_path / "marker"
    payload = pickle.dumps(_Planted(marker))
    pickle.loads(payload)  # the payload is live: loading it runs code
    assert marker.read_text() == "code ran"
    marker.unlink()
    # the names the parser cache of earlier versions read, under every folder it looked in
    old_key = repr((tables.grammar_text(), sorted({"parser": "lalr", "maybe_placeholders": True}.items()),
                    lark.__version__, sys.version_info[:2]))
    names = [f"parser-{hashlib.sha256(old_key.encode()).hexdigest()[:24]}.pickle", "parser.pickle", "tables.json"]
    folders = [tmp_path / "env", tmp_path / "xdg" / "blockir", tmp_path / "home" / ".cache" / "blockir"]
    for folder in folders:
        folder.mkdir(parents=True)
        for name in names:
            (folder / name).write_bytes(payload)
    env = {"BLOCKIR_CACHE_DIR": str(folders[0]), "XDG_CACHE_HOME": str(tmp_path / "xdg"),
           "HOME": str(tmp_path / "home"), "PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-m", "blockir", "check", LLAMA], capture_output=True, text=True,
                          cwd=ROOT, env=env)
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "1 file checked: 0 errors, 0 warnings\n")
    assert not marker.exists()
    assert sorted(p.name for f in folders for p in f.iterdir()) == sorted(names * 3)  # nothing written either


def test_without_triton_the_fused_ops_warn_once_and_use_the_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    from blockir.lower import fused
    from blockir.lower.fused import ops, reference
    monkeypatch.setitem(sys.modules, "triton", None)  # what an install without the extra looks like
    monkeypatch.delitem(sys.modules, "blockir.lower.fused.kernels", raising=False)
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
