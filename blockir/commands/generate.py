"""`blockir generate FOLDER --prompt TEXT`: continue a prompt with a transformers model folder's causal LM.

The folder's own tokenizer encodes the prompt and decodes the result when the folder has one
(read with transformers' ``AutoTokenizer`` from the folder alone, nothing fetched); otherwise the
prompt's UTF-8 bytes are the token ids, which needs a vocabulary of at least 256 entries. The
prompt and its continuation go to stdout.
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from blockir.cli import EXIT_OK, UsageError
from blockir.diagnostics import BlockError, Span, error

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
BYTES = 256
DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def _tokenizer_error(folder: Path, message: str, hint: str | None = None) -> BlockError:
    return BlockError([error("E0841", message, Span(str(folder), 0, 0), hint=hint)])


def tokenizer_of(folder: Path) -> Any | None:
    """The folder's tokenizer, or None when it has no tokenizer files."""
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        return None
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise _tokenizer_error(folder, "the folder has a tokenizer, and reading it needs transformers",
                               "pip install transformers") from None
    try:
        return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except Exception as exc:  # noqa: BLE001 — tokenizer loading raises many types for a broken folder
        raise _tokenizer_error(folder, f"cannot read the folder's tokenizer: {str(exc).splitlines()[0]}",
                               "fix or remove the tokenizer files; without them the prompt's bytes are the ids") from None


def encode(tokenizer: Any | None, prompt: str, vocab: int, folder: Path) -> list[int]:
    if tokenizer is not None:
        return list(tokenizer(prompt)["input_ids"])
    if vocab < BYTES:
        raise _tokenizer_error(folder, f"the folder has no tokenizer, and its vocabulary of {vocab} tokens cannot "
                               "hold the prompt's bytes", "add the model's tokenizer files to the folder")
    return list(prompt.encode("utf-8"))


def decode(tokenizer: Any | None, ids: list[int]) -> str:
    if tokenizer is not None:
        return str(tokenizer.decode(ids, skip_special_tokens=True))
    return bytes(i for i in ids if i < BYTES).decode("utf-8", errors="replace")


def run(args: argparse.Namespace) -> int:
    import torch

    from blockir.lifecycle.pretrained import causal_lm
    if args.max_new_tokens < 0:
        raise UsageError(f"--max-new-tokens must be non-negative, got {args.max_new_tokens}")
    folder = Path(args.folder)
    dtype = getattr(torch, DTYPES[args.dtype]) if args.dtype else None
    lm = causal_lm(folder, exact=args.exact, dtype=dtype, device=args.device)
    tokenizer = tokenizer_of(folder)
    ids = encode(tokenizer, args.prompt, int(lm.config.get("vocab_size") or 0), folder)
    if not ids:
        raise UsageError("the prompt encodes to no tokens; give a non-empty --prompt")
    device = next(lm.parameters()).device
    generator = torch.Generator(device=device).manual_seed(args.seed) if args.seed is not None else None
    out = lm.generate(torch.tensor([ids], device=device), args.max_new_tokens, do_sample=args.sample,
                      temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, generator=generator)
    print(decode(tokenizer, out[0].tolist()))
    return EXIT_OK


def register(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("generate", help="continue a prompt with the causal LM of a transformers model folder")
    s.add_argument("folder", metavar="FOLDER", help="config.json and weights, as save_pretrained writes them")
    s.add_argument("--prompt", required=True, help="the text to continue")
    s.add_argument("--max-new-tokens", type=int, default=32, metavar="N", help="at most N new tokens (default 32)")
    s.add_argument("--sample", action="store_true", help="sample instead of choosing the most likely token")
    s.add_argument("--temperature", type=float, default=1.0, help="divide the scores by this when sampling")
    s.add_argument("--top-k", type=int, default=None, metavar="K", help="sample among the K most likely tokens")
    s.add_argument("--top-p", type=float, default=None, metavar="P",
                   help="sample among the fewest tokens whose probability reaches P")
    s.add_argument("--seed", type=int, default=None, help="seed of the sampling generator")
    s.add_argument("--dtype", choices=sorted(DTYPES), default=None, help="weights' dtype (default: the config's)")
    s.add_argument("--device", default=None, help="where to load the weights (default cpu)")
    s.add_argument("--exact", action="store_true", help="attention as HF's eager reference, op for op")
    s.set_defaults(func=run)
