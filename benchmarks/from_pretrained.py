"""Peak resident memory of loading a model folder: blockir.from_pretrained vs transformers' from_pretrained.

Saves a random LLaMA-style model (about 100M parameters, 400 MiB in fp32) with save_pretrained,
sharded at 100 MB, then loads it in fresh processes, interleaved, and reports each loader's rise
in peak RSS (VmHWM) above the RSS after its imports, once every weight has been read (tensors that
still map the file count once resident), in MiB and as a multiple of the weights' size.

    python benchmarks/from_pretrained.py [--runs 3] [--folder DIR]
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

CONFIG = dict(model_type="llama", vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=8,
              num_attention_heads=12, num_key_value_heads=4, max_position_embeddings=2048)


def _status(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(field)


def child(loader: str, folder: str) -> None:
    import torch
    import transformers  # noqa: F401  (both loaders pay the same imports before the baseline)

    import blockir
    import blockir.lifecycle.pretrained  # noqa: F401
    before = _status("VmRSS")
    if loader == "blockir":
        model = blockir.from_pretrained(folder)
    else:
        model = transformers.AutoModelForCausalLM.from_pretrained(folder)
    weights = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20
    with torch.no_grad():  # read every weight: tensors still backed by the file's mapping become resident too
        for p in model.parameters():
            p.sum()
    assert all(p.dtype == torch.float32 for p in model.parameters())
    print(json.dumps({"rise": _status("VmHWM") - before, "weights": weights}))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--folder", default=None)
    ap.add_argument("--child", nargs=2, metavar=("LOADER", "FOLDER"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(*args.child)
        return
    import torch
    import transformers
    folder = args.folder or tempfile.mkdtemp(prefix="blockir-bench-")
    if not (Path(folder) / "config.json").exists():
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**CONFIG))
        model.save_pretrained(folder, max_shard_size="100MB")
        del model
    rises: dict[str, list[float]] = {"blockir": [], "transformers": []}
    weights = 0.0
    for _ in range(args.runs):
        for loader in rises:
            out = subprocess.run([sys.executable, __file__, "--child", loader, folder], check=True,
                                 capture_output=True, text=True).stdout
            result = json.loads(out.strip().splitlines()[-1])
            rises[loader].append(result["rise"])
            weights = result["weights"]
    print(f"# {datetime.date.today()} — {platform.processor() or platform.machine()}, Python {platform.python_version()}, "
          f"torch {torch.__version__}, transformers {transformers.__version__}; {weights:.0f} MiB of fp32 weights in "
          f"{len(list(Path(folder).glob('*.safetensors')))} shards; median of {args.runs} fresh processes each")
    print("\n| loader | peak RSS rise (MiB) | rise / weights |\n|---|---:|---:|")
    for loader, values in rises.items():
        rise = statistics.median(values)
        print(f"| {loader} | {rise:.0f} | {rise / weights:.2f} |")


if __name__ == "__main__":
    main()
