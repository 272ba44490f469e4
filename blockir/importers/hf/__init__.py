"""The HF importer: a transformers config → the `.block` text of the class it names.

Importing the package imports every family's writers, which register their model types
(``blockir.importers.hf.writer``); ``entry.import_text`` writes one config.
"""
from __future__ import annotations

from blockir.importers.hf import gpt, gptj, llama, moe, more, periodic  # noqa: F401  (each registers its writers)
