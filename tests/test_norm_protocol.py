"""Every norm family fills the whole protocol: schema, facts and forward, from its own file."""
from __future__ import annotations

import inspect
import subprocess
import sys

import pytest
import torch
import torch.fx as fx

import blockir
from blockir.ir.consts import Num
from blockir.ir.kinds import KINDS
from blockir.ir.schema import ArgSpec
from blockir.lower.layers.norm_module import Norm, make_norm
from blockir.norms import FAMILIES, QK_NORMS, NormFamily
from blockir.norms.base import Defaults, plain
from conftest import ROOT

D = 8
# the arguments a family requires (no default) or a checked file states (a padding policy), at values a module
# can be built with
GIVEN = {"steps": Num(4), "padding": "mask"}
NAMES = sorted(FAMILIES)


def _given(f: NormFamily) -> dict:
    given = {k: v for k, v in GIVEN.items() if f.spec().arg(k) is not None}
    assert {a.name for a in f.args if a.required and not a.positional} <= set(given)
    return given


def _overrides(f: NormFamily, method: str) -> bool:
    return getattr(type(f), method) is not getattr(NormFamily, method)


def test_every_family_file_registers_one_family() -> None:
    files = {p.stem for p in (ROOT / "blockir" / "norms").glob("*.py")} - {"__init__", "base", "args", "sharded_rows"}
    assert files == {inspect.getmodule(type(f)).__name__.rsplit(".", 1)[1] for f in FAMILIES.values()}
    assert len({f.rank for f in FAMILIES.values()}) == len(FAMILIES)
    assert KINDS["self_attention"].arg("qk_norm").choices == ("none", *QK_NORMS)
    assert all(FAMILIES[n].qk_norm for n in QK_NORMS)


@pytest.mark.parametrize("name", NAMES)
def test_schema(name: str) -> None:
    f = FAMILIES[name]
    assert f.name == name and f.doc and isinstance(f.args, tuple) and all(isinstance(a, ArgSpec) for a in f.args)
    assert f.args[0].name == "axes" and f.args[0].positional
    assert KINDS[name] == f.spec() and KINDS[name].category == "norm"
    for rule in f.implies:  # a contradiction names arguments the family has
        assert f.spec().arg(rule.when) is not None and f.spec().arg(rule.arg) is not None


@pytest.mark.parametrize("name", NAMES)
def test_facts(name: str) -> None:
    f = FAMILIES[name]
    decl = Defaults(f, _given(f), name="n")
    assert isinstance(f.module_name, str) and f.module_name
    assert isinstance(f.statistics, int) and len(f.reductions) == 2
    assert f.fused_code in (None, "layer", "rms") and f.fuses(decl) == (f.fused_code is not None)
    assert f.scale(decl) in ("per_channel", "scalar", "none")
    keys = f.keys(decl, (D,))
    assert all(isinstance(k, str) and isinstance(s, tuple) for k, s in keys + f.buffers(decl, (D,)))
    assert set(f.affine_keys(decl)) <= {k for k, _ in keys}
    assert f.parameters(decl, D) == sum(torch.Size(s).numel() for _, s in keys)
    assert isinstance(f.manifest(decl, lambda e: e.value if isinstance(e, Num) else e), dict)
    assert f.mismatch("n", [], []) is None
    assert f.batch_coupled == bool(f.context) == bool(f.buffers(decl, (D,)))
    if f.batch_coupled:  # running statistics: calibrated, reset, and folded as one fixed per-channel map
        assert _overrides(f, "running") and _overrides(f, "fixed_map")
    if f.unaffine is not None:  # an affine-free form states only arguments the family has
        assert set(f.unaffine) <= {a.name for a in f.args}


@pytest.mark.parametrize("name", NAMES)
def test_module_from_the_shared_factory(name: str) -> None:
    f = FAMILIES[name]
    assert _overrides(f, "settings") and _overrides(f, "state") and _overrides(f, "describe")
    # a forward: one function (with the arguments it takes from the module), or written against the module
    assert (f.math is not None and _overrides(f, "arguments")) or (f.math is None and _overrides(f, "forward"))
    m = make_norm(name, D, **{k: v.value if isinstance(v, Num) else v for k, v in _given(f).items()})
    assert isinstance(m, Norm) and m.family is f and repr(m).startswith(f"{f.module_name}(")
    decl = Defaults(f, _given(f))
    assert {k: tuple(t.shape) for k, t in m.state_dict().items()} == dict(f.keys(decl, (D,)) + f.buffers(decl, (D,)))
    assert {k for k, _ in m.named_parameters()} == {k for k, _ in f.keys(decl, (D,))}
    x = torch.randn(2, 3, D, generator=torch.Generator().manual_seed(0))
    y = m(x)
    assert y.shape == x.shape and y.dtype == x.dtype and torch.isfinite(y).all()
    if f.batch_coupled:  # the module holding the running statistics resets them for a calibration
        holder = f.running(m)
        assert _overrides(holder.family, "reset") and {"num_batches_tracked", "calibrated_at"} <= set(holder._buffers)


@pytest.mark.parametrize("name", [n for n in NAMES if FAMILIES[n].math is not None])
def test_a_math_forward_is_one_traced_call(name: str) -> None:
    f = FAMILIES[name]
    traced = fx.symbolic_trace(make_norm(name, D))
    assert [n.target for n in traced.graph.nodes if n.op == "call_function"] == [f.math]


def test_the_facts_import_without_torch() -> None:
    code = "import sys, blockir.norms, blockir.ir.kinds; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, env={"PYTHONPATH": str(ROOT)})


# the families whose compiled call states their settings, which the lift reads from the call itself
READ_FROM_THE_CALL = {"layernorm", "rmsnorm"}


def test_every_other_family_reads_its_declaration_back() -> None:
    assert {n for n in NAMES if not _overrides(FAMILIES[n], "declared")} == READ_FROM_THE_CALL


@pytest.mark.parametrize("name", sorted(set(NAMES) - READ_FROM_THE_CALL))
def test_the_declaration_read_back_from_a_module_builds_the_same_module(name: str) -> None:
    f = FAMILIES[name]
    given = {k: v.value if isinstance(v, Num) else v for k, v in _given(f).items()}
    module = make_norm(name, D, **given)
    source = (f"dim B: batch\ndim S: seq\ndim D: model = {D}\nblock A(x: [B, S, D]) -> [B, S, D] {{\n"
              f"  n: {name}(D, {f.declared(module)})\n  y = n(x)\n  return y\n}}\n")
    decl = blockir.parse(source, "read_back.block").block("A").decl_map["n"]

    def settings(s: dict) -> dict:  # the name and place of a declaration are no settings of its module
        return {k: settings(v) if isinstance(v, dict) else v for k, v in s.items() if k not in ("label", "span")}
    assert settings(f.settings(decl, plain)) == settings(f.settings(Defaults(f, _given(f), name="n"), plain))
