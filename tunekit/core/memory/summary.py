"""The memory estimate and the measured memory report in a few aligned lines: what ``print(est)``
and ``print(rep)`` show, and the same as HTML in a notebook. Pure formatting.

    >>> print(estimate_memory(124e6, n_layer=12, n_embd=768, n_head=12, seq_len=1024, micro_batch=8))
    memory estimate · 124M params · mixed · adamw · micro_batch 8 × seq_len 1024 · cuda
      total            10.4 GiB (11.17 GB) per device; a lower bound: buffers unknown
      weights          236.5 MiB    2%
      ...
"""
from __future__ import annotations

import html

from tunekit.core.fmt import fmt_bytes, fmt_count, fmt_pct
from tunekit.core.summary import MAX_LINES, lines_html, lines_text, with_notes
from tunekit.core.units import GB, is_missing

WIDTH = 16   # the longest component name (optimizer_states)


def estimate_head(est) -> str:
    i = est.inputs
    parts = [f"{fmt_count(i['n_params'])} params" if not is_missing(i.get("n_params")) else "params n/a",
             str(i.get("layout")), str(i.get("optimizer"))]
    if i.get("seq_len"):
        parts.append(f"micro_batch {i.get('micro_batch')} × seq_len {i['seq_len']}")
    if i.get("checkpointing"):
        parts.append("checkpointing")
    split = [f"{k}={i[k]}" for k in ("tp", "pp", "dp", "zero_stage") if i.get(k) not in (None, 0, 1)]
    parts += [" ".join(split)] if split else []
    return "memory estimate · " + " · ".join(parts + [str(i.get("device"))])


def estimate_rows(est) -> list[tuple[str, str]]:
    """(component, 'bytes share') rows: the total first, then every known non-zero line."""
    total = est.total_bytes
    unknown = [k for k, v in est.components.items() if is_missing(v)]
    rows = [("total", f"{fmt_bytes(total)} ({total / GB:.2f} GB) per device"
             + (f"; a lower bound: {', '.join(unknown)} unknown" if unknown else ""))]
    rows += [(k, f"{fmt_bytes(v):>10}  {fmt_pct(v / total if total else 0, 0):>4}")
             for k, v in est.components.items() if not is_missing(v) and v]
    return with_notes(rows, est.notes, 1)


def estimate_text(est) -> str:
    return lines_text(estimate_head(est), estimate_rows(est), WIDTH)


def estimate_html(est) -> str:
    return lines_html(html.escape(estimate_head(est)), estimate_rows(est))


def report_head(rep) -> str:
    return f"memory of one training step · {rep.layout} on {rep.device} · measured vs estimated"


def report_rows(rep) -> list[tuple[str, str]]:
    """(component, 'measured estimated error') rows, the device's readings on one line."""
    est = rep.estimate.components if rep.estimate is not None else {}
    rows = [("component", f"{'measured':>10}  {'estimated':>10}  {'error':>6}")]
    for k, v in rep.measured.items():
        e = est.get(k)
        if (is_missing(v) or not v) and (is_missing(e) or not e):
            continue
        err = rep.error(k)
        rows.append((k, f"{fmt_bytes(v):>10}  {fmt_bytes(e):>10}  {fmt_pct(err, 0, signed=True):>6}"))
    cuda = {k: v for k, v in rep.cuda.items() if not isinstance(v, str)}
    if cuda:
        rows.append(("device", " · ".join(f"{k.replace('_', ' ')} {fmt_bytes(v)}" for k, v in cuda.items())))
    # the same components on both sides (the estimate's own total adds the CUDA context and temporaries)
    total = sum(v for v in rep.measured.values() if not is_missing(v))
    same = [est.get(k) for k in rep.measured] if est else [None]
    guess = None if any(is_missing(e) for e in same) else sum(same)
    rows.insert(1, ("total", f"{fmt_bytes(total):>10}  {fmt_bytes(guess):>10}"))
    rows = rows[:MAX_LINES - 2]
    return with_notes(rows, rep.notes, 1)


def report_text(rep) -> str:
    return lines_text(report_head(rep), report_rows(rep), WIDTH)


def report_html(rep) -> str:
    return lines_html(html.escape(report_head(rep)), report_rows(rep))

