"""A random transformers causal LM of a given config, saved with save_pretrained into a temporary folder that
is removed when the benchmark exits: what the benchmarks that load model folders start from."""
from __future__ import annotations

import atexit
import shutil
import tempfile
from typing import Any


def saved_model(config: dict[str, Any]) -> str:
    import transformers
    folder = tempfile.mkdtemp(prefix="blockir-bench-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**config)).save_pretrained(folder)
    return folder
