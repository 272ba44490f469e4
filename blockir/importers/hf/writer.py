"""The writer registry: model type → the function that writes its `.block` text, and how it declares norms.

Each family module registers its model types where it defines their writer (:func:`writes`); importing
``blockir.importers.hf`` imports every family module, so the registry is full before any import runs.
"""
from __future__ import annotations

from typing import Callable

from blockir.importers.hf.text import Config, Norm

Writer = Callable[[Config, str, bool], str]  # (config, model type, exact) -> the file's text

WRITERS: dict[str, Writer] = {}
NORMS: dict[str, Norm] = {}  # model type -> how its HF classes build every norm


def register(model_type: str, write: Writer, norm: Norm) -> None:
    if model_type in WRITERS:
        raise ValueError(f"model type '{model_type}' has two writers")
    WRITERS[model_type] = write
    NORMS[model_type] = norm


def writes(*model_types: str, norm: Norm) -> Callable[[Writer], Writer]:
    """Register the decorated writer for ``model_types``, whose norms all follow ``norm``."""
    def add(write: Writer) -> Writer:
        for t in model_types:
            register(t, write, norm)
        return write
    return add
