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
    from blockir.backends.release import canary, read_artifact, restore
    from blockir.commands.run import set_threads
    set_threads(1)
    if args.windows < 1 or args.repeats < 1:
        raise UsageError("--windows and --repeats must be at least 1")
    old, new = read_artifact(args.old), read_artifact(args.new)
    report = canary(old, new, args.data, args.windows, args.repeats, given_thresholds(args))
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
    r.set_defaults(func=run)
