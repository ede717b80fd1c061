"""Which run the others are compared with, and how each run differs from it. Pure.

A run's stored label says how it differs from the toggles' defaults; a comparison needs how it
differs from the run it is compared with. ``pick`` chooses that baseline (one asked for by id, or
the newest finished single-process run with every toggle at its default) and says why;
``difference`` names every run by what differs from it.

    >>> i, why = pick(runs)                    # index into runs, and a sentence for the report
    >>> [difference(r, runs[i]) for r in runs]
    ['baseline', 'bf16', 'ckpt']
"""
from __future__ import annotations

import dataclasses
import math

from tunekit.core.fmt import fmt_bytes
from tunekit.core.toggles import Toggles, label
from tunekit.core.units import is_missing


def _get(run, name, default=None):
    v = run.get(name, default) if isinstance(run, dict) else getattr(run, name, default)
    return None if is_missing(v) else v


def toggles_of(run) -> Toggles:
    """A run's Toggles: its own, or rebuilt from a flat record / DataFrame row (NaN -> None)."""
    t = _get(run, "toggles")
    if isinstance(t, Toggles):
        return t
    known = {f.name: _get(run, f.name) for f in dataclasses.fields(Toggles)}
    known = {k: v for k, v in known.items() if v is not None or k in ("seq_len", "attention")}
    for f in dataclasses.fields(Toggles):  # pandas turns an int column holding None into floats
        if f.type == "int" and isinstance(known.get(f.name), float):
            known[f.name] = int(known[f.name])
        if f.type == "bool" and f.name in known:
            known[f.name] = bool(known[f.name])
    return Toggles().replace(**known)


def layout(run) -> str:
    """'1 process', or 'ddp · 2 ranks · 1 node' for a distributed run."""
    world = _get(run, "world_size")
    if not world:
        return "1 process"
    nodes = _get(run, "nodes") or 1
    return f"{_get(run, 'parallel')} · {int(world)} rank{'s' if world != 1 else ''} · " \
           f"{int(nodes)} node{'s' if nodes != 1 else ''}"


def pick(runs, baseline: int | None = None) -> tuple[int, str]:
    """(index of the baseline in ``runs``, why it is the baseline). ``baseline``: a run id asked
    for (a ValueError naming the ids there are when no run has it); None: the newest finished
    single-process run with every toggle at its default (its label 'baseline': the Lab stores
    seq_len and attention resolved to the model's), else the first finished run."""
    runs = list(runs)
    if not runs:
        raise ValueError("no runs to compare")
    ids = [_get(r, "run_id") for r in runs]

    def name(i):  # the baseline's own label says how it differs from the defaults
        lbl = _get(runs[i], "label")
        return f"run #{ids[i]}" + (f" ({lbl})" if lbl and lbl != "baseline" else "")

    if baseline is not None:
        if baseline not in ids:
            raise ValueError(f"no run #{baseline} to compare with: the runs are "
                             f"{', '.join(f'#{i}' for i in ids)}")
        i = ids.index(baseline)
        return i, f"{name(i)}, the baseline asked for"
    ok = [i for i, r in enumerate(runs) if (_get(r, "status") or "ok") == "ok"]
    default = [i for i in ok if not _get(runs[i], "world_size")
               and (toggles_of(runs[i]) == Toggles() or _get(runs[i], "label") == "baseline")]
    if default:
        return default[-1], (f"{name(default[-1])}, the newest run with every toggle at its default "
                             "(choose another with --baseline N)")
    i = ok[0] if ok else 0
    return i, (f"{name(i)}, the first run that finished: no run has every toggle at its default "
               "(choose another with --baseline N)")


def difference(run, base) -> str:
    """What ``run`` changes relative to ``base``: 'bf16 ckpt', 'fp32 mb=16', 'ddp · 2 ranks ...',
    'baseline' for the baseline itself, '= baseline' for a repeat of it."""
    if run is base:
        return "baseline"
    parts = []
    if _get(run, "model") != _get(base, "model") and _get(run, "model"):
        parts.append(str(_get(run, "model")))
    if layout(run) != layout(base):
        parts.append(layout(run))
    toggles = label(toggles_of(run), toggles_of(base))
    if toggles != "baseline":
        parts.append(toggles)
    return " ".join(parts) or "= baseline"


def comm_lines(comm) -> list[str]:
    """A distributed run's collectives per optimizer step: bytes by kind, then by scope
    (intra-node, inter-node). [] for a single-process run or uncounted communication."""
    if not isinstance(comm, dict) or not comm.get("by_kind"):
        return []

    def row(table, words):
        return " · ".join(f"{words.get(k, k)} {fmt_bytes(v.get('bytes'))}"
                          + (f" ({v['count']} call{'s' if v['count'] != 1 else ''})" if v.get("count") else "")
                          for k, v in table.items())

    lines = [f"by kind: {row(comm['by_kind'], {})}"]
    if comm.get("by_scope"):
        lines.append(f"by scope: {row(comm['by_scope'], {'intra': 'within a node', 'inter': 'across nodes'})}")
    return lines


def comm_total(comm) -> float:
    """Bytes of every collective of one step, NaN for a run without counted communication."""
    if not isinstance(comm, dict) or not comm.get("by_kind"):
        return math.nan
    return float(sum(v.get("bytes") or 0 for v in comm["by_kind"].values()))
