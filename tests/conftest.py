"""Shared test helpers: golden files and the GPU marker."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

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
