"""Shared test helpers: golden files and the GPU marker."""
from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import pytest

# torch.compile's on-disk cache keys a graph by its code, not by the fake (shape) functions of the custom ops
# it calls: a cache another checkout of blockir filled would hand these tests graphs built for other shapes
if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
    _INDUCTOR_CACHE = tempfile.mkdtemp(prefix="blockir-tests-inductor-")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = _INDUCTOR_CACHE
    atexit.register(shutil.rmtree, _INDUCTOR_CACHE, ignore_errors=True)

import torch  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "examples").glob("*.block"))
UPDATE = os.environ.get("BLOCKIR_UPDATE_GOLDENS") == "1"


def check_golden(path: Path, actual: str) -> None:
    """Compare with a reviewed golden file; BLOCKIR_UPDATE_GOLDENS=1 rewrites it instead."""
    if UPDATE or not path.exists():
        if not UPDATE:
            pytest.fail(f"missing golden {path.relative_to(ROOT)}; run with BLOCKIR_UPDATE_GOLDENS=1 and review it")
        path.write_text(actual)
        return
    assert actual == path.read_text(), f"output differs from {path.relative_to(ROOT)}"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
