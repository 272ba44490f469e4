"""`blockir release CKPT --out DIR [--previous DIR]`: write an immutable release artifact and its manifest.

The manifest (YAML, or JSON with ``--format json``) goes to stdout and into ``DIR/release.yaml``;
the artifact's hash (the sha256 of ``release.yaml``) goes to stderr. The canary's trigger thresholds
are fixed here, in the manifest, so a canary cannot choose them after seeing the numbers.
"""
from __future__ import annotations

import argparse

from blockir.cli import EXIT_OK, UsageError, add_force_option, add_format_option, log, print_json

THRESHOLD_OPTIONS = (("max_logit_error", "max |new - old| of the logits"),
                     ("max_loss_increase", "validation loss increase in nats"),
                     ("max_latency_ratio", "median forward time, new / old"),
                     ("max_memory_ratio", "parameter bytes, new / old"),
                     ("max_non_finite", "non-finite logits"))


def add_threshold_options(p: argparse.ArgumentParser, defaults: dict[str, float] | None) -> None:
    for name, what in THRESHOLD_OPTIONS:
        default = f" (default {defaults[name]:g})" if defaults else " (default: the candidate's manifest)"
        p.add_argument("--" + name.replace("_", "-"), type=float, dest=name, metavar="X", help=what + default)


def given_thresholds(args: argparse.Namespace) -> dict[str, float]:
    from blockir.lifecycle.release_manifest import threshold
    given = {name: getattr(args, name) for name, _ in THRESHOLD_OPTIONS if getattr(args, name) is not None}
    for name, value in given.items():
        if not threshold(value):
            raise UsageError(f"--{name.replace('_', '-')} must be a number >= 0, got {value}")
    return given


def run(args: argparse.Namespace) -> int:
    from blockir.analyses.manifest import to_yaml
    from blockir.lifecycle.thresholds import DEFAULT_THRESHOLDS
    from blockir.lifecycle import destination
    from blockir.lifecycle.release import release
    from blockir.commands.run import set_threads
    set_threads(1)
    thresholds = {**DEFAULT_THRESHOLDS, **given_thresholds(args)}
    destination.check(args.out, "--out", destination.RELEASE, args.force,
                      [("CKPT", args.checkpoint), ("--previous", args.previous)], code="E0728")
    manifest, digest = release(args.checkpoint, args.out, args.previous, thresholds)
    if args.format == "json":
        print_json(manifest)
    else:
        print(to_yaml(manifest, report=True), end="")
    log(f"released {args.out}: sha256 {digest}")
    return EXIT_OK


def register(sub: argparse._SubParsersAction) -> None:
    from blockir.lifecycle.thresholds import DEFAULT_THRESHOLDS
    r = sub.add_parser("release", help="write an immutable release artifact of a checkpoint with its manifest")
    r.add_argument("checkpoint", metavar="CKPT", help="a `blockir run --save` or `blockir migrate --out` directory")
    r.add_argument("--out", required=True, metavar="DIR", help="the release directory (new or empty)")
    add_force_option(r, "--out", "release")
    r.add_argument("--previous", metavar="DIR", help="the release in service: the rollback pointer")
    add_threshold_options(r, DEFAULT_THRESHOLDS)
    add_format_option(r, "yaml")
    r.set_defaults(func=run, writes="--out")
