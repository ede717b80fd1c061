"""``tunekit diff A B``: what changed between two saved Lab runs (`tunekit.diff`), from a shell.

    tunekit diff runs.jsonl#0 runs.jsonl#3     # run 0 and run 3 of one log
    tunekit diff before.jsonl after.jsonl      # the last run of each log

A side is ``PATH`` (a JSONL run log: its last run), ``PATH#ID`` (run ID of that log) or
``PATH#SESSION/ID`` (run ID of one Lab's session, where the day's shared log holds several Labs' runs
numbered from 0 each: ``PATH#ID`` then names no run, and the refusal lists each candidate by this
name). Exit 0, or 2 when a side cannot be read, names no run or more than one, or the two runs
cannot be compared (different models), before any work.
"""
from __future__ import annotations

import argparse
import re
import sys
import warnings
from pathlib import Path

from tunekit.cli.model import Refused
from tunekit.core.validate import did_you_mean


def diff_parser(parser_class=argparse.ArgumentParser, formatter=argparse.HelpFormatter) -> argparse.ArgumentParser:
    p = parser_class(prog="tunekit diff", add_help=False, formatter_class=formatter,
                     description="What changed between two saved Lab runs: the settings, the step time, "
                                 "memory, and where both were traced the time by op category and the ops "
                                 "added or removed (tunekit.diff).")
    p.add_argument("-h", "--help", action="help", help="show this help message and exit")
    p.add_argument("a", help="the run to compare from: LOG.jsonl (its last run), LOG.jsonl#ID or, where "
                             "several Labs' runs share the log, LOG.jsonl#SESSION/ID")
    p.add_argument("b", help="the run to compare with it, the same way")
    p.add_argument("--ops", type=int, default=10, help="how many ops to list (those that moved most)")
    return p


def read_side(spec: str):
    """The run a side names, as a RunResult; `Refused` with the reason when it names none."""
    from tunekit.lab.runlog import RunLog, read_records

    path, _, run_id = spec.partition("#")
    if not Path(path).is_file():
        raise Refused(f"{spec}: no such log file{_meant(path, run_id)}")
    with warnings.catch_warnings(record=True) as said:   # lines that are no run: said once, below
        warnings.simplefilter("always")
        runs = RunLog.load(path)
    if not runs:
        skipped = read_records(path)[1]
        raise Refused(f"{spec}: not a run log: none of its {skipped} lines is a run record (tunekit run --log "
                      "and lab.run write one)" if skipped else f"{spec}: the log holds no run")
    for w in said:
        print(f"tunekit diff: {str(w.message).removeprefix('tunekit: ')}", file=sys.stderr)
    if not run_id:
        return runs[-1]
    session, by_session, run_id = run_id.strip().rpartition("/")
    found = [r for r in runs if str(r.run_id) == run_id and (not by_session or r.session == (session or None))]
    if not found:
        raise Refused(f"{spec}: no run #{run_id}{f' of session {session!r}' if by_session else ''} in the log "
                      "(its runs: " + ", ".join(_name(r) for r in runs[:20]) + ("..." if len(runs) > 20 else "") + ")")
    if len({r.session for r in found}) > 1:
        raise Refused(f"{spec} could be any of {len(found)} runs, one per Lab session that shared the log: name one "
                      "as " + "; ".join(f"{path}#{r.session or ''}/{r.run_id} ({r.label}, {r.time})" for r in found))
    return found[-1]


def _meant(path: str, run_id: str) -> str:
    """What a side that names no file was probably meant as: a run id alone ('0', '#0', 'S/0') is
    that run of the log ``tunekit run`` writes here (``tunekit-runs.jsonl``), where it exists; else
    the run logs of this folder."""
    from tunekit.cli.options import LOG

    ident = run_id if not path else path if not run_id else ""
    if re.fullmatch(r"([\w.-]+/)?\d+", ident.strip()) and Path(LOG).is_file():
        return f" (a side is LOG.jsonl#ID){did_you_mean(f'{LOG}#{ident.strip()}', quote=False)}"
    logs = sorted(p.name for p in Path(".").glob("*.jsonl"))
    return (" (a side is LOG.jsonl, LOG.jsonl#ID or LOG.jsonl#SESSION/ID; the .jsonl files here: "
            + ", ".join(logs[:10]) + ")" if logs else "")


def _name(r) -> str:
    """A run of a log as a side names it: ``#ID``, or ``#SESSION/ID`` for a Lab session's run."""
    return f"#{r.session}/{r.run_id}" if r.session else f"#{r.run_id}"


def _two_runs(spec_a: str, spec_b: str, a, b) -> None:
    """`Refused` where both sides name one run of one log, with two runs of it to name instead."""
    from tunekit.lab.runlog import RunLog

    path_a, path_b = spec_a.partition("#")[0], spec_b.partition("#")[0]
    if Path(path_a).resolve() != Path(path_b).resolve() or (a.session, a.run_id) != (b.session, b.run_id):
        return
    runs = RunLog.load(path_a)
    at = next((i for i, r in enumerate(runs) if (r.session, r.run_id) == (a.session, a.run_id)), 0)
    pair = runs[max(at - 1, 0):][:2]
    hint = f": name two runs, as {' '.join(path_a + _name(r) for r in pair)}" if len(pair) == 2 else \
        ": the log holds no other run"
    raise Refused(f"{spec_a} and {spec_b} both name run {_name(a)} ({a.label}){hint}")


def diff_main(args) -> int:
    from tunekit.core.diff import diff

    try:
        a, b = read_side(args.a), read_side(args.b)
        _two_runs(args.a, args.b, a, b)
        d = diff(a, b)
    except (Refused, ValueError, TypeError) as e:
        print(f"tunekit diff: error: {e}", file=sys.stderr)
        return 2
    print(d.text(ops=max(0, args.ops)))
    return 0
