"""`blockir canary OLD NEW [--data PATH] [--slot DIR]`: compare two releases on the same inputs.

OLD is the release in service, NEW a candidate released with ``--previous OLD``. Both run on the
same validation windows; logits, validation loss, forward latency, parameter memory and non-finite
values are checked against the thresholds NEW's manifest declares. The report goes to stdout; exit
0 when every check passes, 1 at any breach. With ``--slot DIR`` the slot then holds NEW (promoted)
or, at a breach, OLD restored whole (rolled back).
"""
from __future__ import annotations

import argparse

from blockir.cli import EXIT_ERRORS, EXIT_OK, UsageError, add_format_option, log, print_json
from blockir.commands.release import add_threshold_options, given_thresholds

MAX_WINDOWS = 4096  # validation windows held at once for both models' logits
MAX_REPEATS = 1000


def _text(report: dict) -> str:
    lines = [f"old {report['old']['path']} ({report['old']['sha256'][:12]})",
             f"new {report['new']['path']} ({report['new']['sha256'][:12]})", report["inputs"], ""]
    lines.append(f"{'check':<15}{'value':>12}{'threshold':>12}  result")
    for c in report["checks"]:
        lines.append(f"{c['check']:<15}{c['value']:>12.4g}{c['threshold']:>12.4g}  "
                     f"{'BREACHED' if c['breached'] else 'ok'}  ({c['what']})")
    verdict = "passed" if report["passed"] else "failed"
    action = report.get("slot")
    lines.append("")
    lines.append(f"canary {verdict}" + (f"; {action}" if action else ""))
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from blockir.lifecycle import destination
    from blockir.lifecycle.release import canary, read_artifact, restore
    from blockir.commands.run import set_threads
    set_threads(1)
    if not 1 <= args.windows <= MAX_WINDOWS or not 1 <= args.repeats <= MAX_REPEATS:
        raise UsageError(f"--windows must be in 1..{MAX_WINDOWS} and --repeats in 1..{MAX_REPEATS}")
    overrides = given_thresholds(args)
    if args.slot:  # before any work; the slot is meant to be replaced, by a release only
        destination.check(args.slot, "--slot", destination.RELEASE, True,
                          [("OLD", args.old), ("NEW", args.new), ("--data", args.data)])
    old, new = read_artifact(args.old), read_artifact(args.new)
    report = canary(old, new, args.data, args.windows, args.repeats, overrides)
    if args.slot:
        chosen = new if report["passed"] else old
        restore(chosen, args.slot)
        report["slot"] = f"{'promoted' if report['passed'] else 'rolled back'}: {args.slot} holds {chosen.path} " \
                         f"({chosen.sha256[:12]})"
        log(report["slot"])
    if args.format == "json":
        print_json(report)
    else:
        print(_text(report))
    return EXIT_OK if report["passed"] else EXIT_ERRORS


def register(sub: argparse._SubParsersAction) -> None:
    r = sub.add_parser("canary", help="compare a candidate release with the one in service on the same inputs; "
                                      "exit 1 at any breached threshold")
    r.add_argument("old", metavar="OLD", help="the release in service")
    r.add_argument("new", metavar="NEW", help="the candidate release (released with --previous OLD)")
    r.add_argument("--data", metavar="PATH", help="text the windows are taken from (default: the standard "
                   "library's source)")
    r.add_argument("--windows", type=int, default=8, help="validation windows fed to both (default 8)")
    r.add_argument("--repeats", type=int, default=5, help="timed forwards per artifact (default 5)")
    r.add_argument("--slot", metavar="DIR", help="the serving slot: promote NEW into it on a pass, restore OLD "
                   "whole on a breach")
    add_threshold_options(r, None)
    add_format_option(r)
    r.set_defaults(func=run, writes="--slot")
