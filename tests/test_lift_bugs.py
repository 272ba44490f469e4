"""Hand-written blocks with real residual-stream bugs: each reported with its code at the line of the mistake."""
from __future__ import annotations

import inspect
import re

import pytest
import torch

import blockir
from lift_models import buggy
from lift_models import one_thread  # noqa: F401  (fixture)

EXPECT = re.compile(r"# expect: ([EW]\d{4})$")
SOURCE = inspect.getsourcefile(buggy)
MARKS = {i + 1: m[1] for i, line in enumerate(open(SOURCE).read().splitlines()) if (m := EXPECT.search(line))}
CASES = {"DropoutAfterAdd": "E0402", "DroppedShortcut": "E0401", "NormOverSeq": "E0301", "SharedNorm": "E0307",
         "NormalizedResidual": "E0412", "NoFinalNorm": "E0403", "DoubledFinalNorm": "E0307",
         "OffsetTwiceLayer": "E0909", "ProjectedShortcut": "E0409"}


def test_every_marked_mistake_has_a_case() -> None:
    assert sorted(MARKS.values()) == sorted(CASES.values())


@pytest.mark.parametrize("name", CASES)
def test_the_bug_is_reported_at_its_line(name: str) -> None:
    torch.manual_seed(0)
    result = blockir.lift(getattr(buggy, name)(), torch.randn(2, 5, 32))
    found = [(d.code, d.span.filename, d.span.line) for d in result.diagnostics if d.is_error]
    line = next(n for n, code in MARKS.items() if code == CASES[name] and _owner(n) == name)
    assert found == [(CASES[name], SOURCE, line)], result.render()
    assert result.max_error is None
    assert "Traceback" not in result.render()


def _owner(line: int) -> str:
    """The class whose source holds ``line`` (a bug inside a norm class belongs to its user)."""
    users = {"SeqRMSNorm": "NormOverSeq", "OffsetTwice": "OffsetTwiceLayer"}
    for name, cls in inspect.getmembers(buggy, inspect.isclass):
        if cls.__module__ != buggy.__name__:
            continue
        lines, start = inspect.getsourcelines(cls)
        if start <= line < start + len(lines):
            return users.get(name, name)
    raise AssertionError(line)


def test_a_shared_norm_is_rendered_at_both_python_sites() -> None:
    torch.manual_seed(0)
    result = blockir.lift(buggy.SharedNorm(), torch.randn(2, 5, 32))
    line = next(n for n, code in MARKS.items() if code == "E0307" and _owner(n) == "SharedNorm")
    assert result.render() == f"""\
{SOURCE}:{line}:9: error[E0307]: layernorm 'ln' is applied to 'x' and to 'add': one instance at two sites ties their learned scale
          return h + self.mlp(self.ln(h))  # expect: E0307
          ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
  = note: {SOURCE}:{line - 1}:9: first applied here
            h = x + self.attn(self.ln(x))
            ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
  = hint: declare one norm per site, or tied=true if the checkpoint really shares it"""
