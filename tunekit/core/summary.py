"""Turn a ProfileRecord into a compact text or HTML summary. Pure formatting: no measuring."""
from __future__ import annotations

import functools
import html

from tunekit.core.bounds import FLAG, WORDS, mark, over
from tunekit.core.conditions import BUSY, QUIET
from tunekit.core.fmt import FORMATS, fmt_bytes, fmt_flops, fmt_pct, fmt_seconds, fmt_tflops, formatted
from tunekit.core.notes import of_kind
from tunekit.core.slowed import slowed_by
from tunekit.core.units import MiB, is_missing


def rows(rec) -> list[tuple[str, str]]:
    """(label, value) pairs shared by the text and HTML views."""
    flops = fmt_flops(rec.flops)
    if rec.flops_source != "none":
        flops += f" ({rec.flops_source})"
    if not is_missing(rec.recompute_flops) and rec.recompute_flops:
        flops += f", of which {fmt_flops(rec.recompute_flops)} recomputed"
    bound = getattr(rec, "above_peak", None)
    util = f"{mark('MFU ' + fmt_pct(rec.mfu), rec.mfu, bound)} · {mark('HFU ' + fmt_pct(rec.hfu), rec.hfu, bound)}"
    if not is_missing(rec.peak_tflops):
        util += f" of {fmt_tflops(rec.peak_tflops, 4)} [{rec.peak_tflops_source}]"
    gpu = (f"alloc {fmt_bytes(rec.gpu_alloc_delta_bytes, True)} · peak {fmt_bytes(rec.gpu_peak_delta_bytes, True)}"
           f" · reserved {fmt_bytes(rec.gpu_reserved_bytes)} · NVML used {fmt_bytes(rec.nvml_used_bytes)}")
    out = [
        ("time", fmt_seconds(rec.wall_s)),
        ("FLOPs", flops),
        ("speed", f"{mark(fmt_tflops(rec.tflops), rec.hfu, bound)} · {util}"),
        ("CPU RAM", f"RSS {fmt_bytes(rec.cpu_rss_delta_bytes, True)} · "
                    f"peak {fmt_bytes(rec.cpu_peak_delta_bytes, True)}"),
    ]
    if not all(is_missing(getattr(rec, k)) for k in ("gpu_alloc_delta_bytes", "gpu_peak_delta_bytes",
                                                      "gpu_reserved_bytes", "nvml_used_bytes")):
        out.append(("GPU", gpu))  # no row of n/a's where there is no GPU
    if not is_missing(rec.exp_cpu_consumed_bytes):
        leak = (f"CPU consumed {fmt_bytes(rec.exp_cpu_consumed_bytes)}, "
                f"reclaimed {fmt_bytes(rec.exp_cpu_reclaimed_bytes)}")
        if not is_missing(rec.exp_gpu_consumed_bytes):
            leak += (f" · GPU consumed {fmt_bytes(rec.exp_gpu_consumed_bytes)}, "
                     f"reclaimed {fmt_bytes(rec.exp_gpu_reclaimed_bytes)}")
        out.append(("experiment", leak))
    if bound:
        out.append(("bound", f"{WORDS}: {bound}"))
    if getattr(rec, "trace", None) is not None:
        t = rec.trace
        out.append(("trace", f"{t.short()} · profiler overhead {t.overhead_text()}"))
    if getattr(rec, "explained", None):   # --plan: the traced step against the plan's expected step
        out.append(("vs plan", rec.explained))
    if getattr(rec, "memory", None) is not None:
        out.append(("memory", rec.memory.short()))
    if not is_missing(getattr(rec, "energy_j", None)):
        out.append(("energy", f"{rec.energy_j:.3g} J · {rec.mean_w:.3g} W mean ({rec.energy_source})"))
    cond = getattr(rec, "conditions", None)
    if cond is not None:
        out.append(("machine", f"{cond.verdict.upper() if cond.verdict == BUSY else cond.verdict}: {cond.reason}"))
    if rec.error:
        out.append(("error", rec.error))
    return out + note_rows(rec.notes)


def note_rows(notes) -> list[tuple[str, str]]:
    """One row per note, labelled once: ("notes", first), ("", second), ... so that each note
    starts on its own line, aligned under the first (text and HTML alike).

    Example: ``note_rows(["a", "b"])`` is ``[("notes", "a"), ("", "b")]``."""
    return [("notes" if i == 0 else "", str(n)) for i, n in enumerate(notes or [])]


NOTE_WIDTH = 90     # a note longer than this goes on over more lines in a terminal


def _wrapped(pairs) -> list[tuple[str, str]]:
    """The note rows of ``pairs`` wrapped at NOTE_WIDTH, their next lines under their first."""
    import textwrap

    out = []
    for k, v in pairs:
        if k in ("notes", "") and len(v) > NOTE_WIDTH:
            first, *rest = textwrap.wrap(v, NOTE_WIDTH, break_long_words=False, break_on_hyphens=False)
            out += [(k, first)] + [("", "  " + r) for r in rest]   # a continuation is indented
        else:
            out.append((k, v))
    return out


def busy_badge(rec) -> str:
    """' · ⚠ busy machine' when the record was measured while other work ran, else ''."""
    cond = getattr(rec, "conditions", None)
    if cond is None or cond.verdict == QUIET:
        return ""
    return f" · ⚠ {cond.verdict} machine" if cond.verdict == BUSY else " · conditions unknown"


def bound_badge(rec) -> str:
    """' · ⚠ above the peak' when a figure of the record is past its bound, else ''."""
    return f" · {WORDS}" if getattr(rec, "above_peak", None) else ""


def title(rec) -> str:
    return f"⏱ {rec.name} · {rec.device or 'unknown device'}{busy_badge(rec)}{bound_badge(rec)}"


def to_text(rec) -> str:
    return lines_text(title(rec), _wrapped(rows(rec)), width=10)


def to_html(rec) -> str:
    head = html.escape(f"⏱ {rec.name} · {rec.device or 'unknown device'}")
    return lines_html(head + badge_html(getattr(rec, "conditions", None)) + bound_html(rec), rows(rec),
                      "#b00020" if rec.error else "#555")


# --- one shape for every record's summary: a title, then aligned (label, value) rows ----------------


def lines_text(head: str, pairs, width: int = 8) -> str:
    """``head`` and one ``  label  value`` line per pair, the values aligned (terminal reprs)."""
    return "\n".join([head] + [f"  {k:<{width}} {v}" for k, v in pairs])


MAX_LINES = 12      # a summary fits a terminal's glance: at most this many lines


def with_notes(rows: list, notes, used: int = 1) -> list:
    """``rows`` plus as many ("note", text) rows as fit in MAX_LINES (``used`` lines taken by the
    title and such), the rest counted on one line."""
    notes = list(notes or [])
    room = MAX_LINES - used - len(rows)
    if len(notes) > room:
        shown = max(room - 1, 0)
        return rows + [("note", n) for n in notes[:shown]] + [("note", f"(+{len(notes) - shown} more in .notes)")]
    return rows + [("note", n) for n in notes]


def lines_html(head_html: str, pairs, color: str = "#555") -> str:
    """The same as a small bordered block (notebook reprs); ``head_html`` is HTML already (badges),
    the pairs are text."""
    body = "".join(
        f"<tr><th style='text-align:left;padding:1px 8px 1px 0;font-weight:600'>{html.escape(k)}</th>"
        f"<td style='text-align:left;padding:1px 0'>{html.escape(v)}</td></tr>" for k, v in pairs)
    return (f"<div style='font-family:monospace;font-size:12px;border-left:3px solid {color};"
            f"padding:2px 8px;margin:2px 0'><div style='color:{color};font-weight:600'>{head_html}</div>"
            f"<table style='border-collapse:collapse'>{body}</table></div>")


def badge_html(cond) -> str:
    """A visible orange 'busy machine' pill (its reason on hover); nothing for a quiet record."""
    if cond is None or cond.verdict == QUIET:
        return ""
    word = "busy machine" if cond.verdict == BUSY else "conditions unknown"
    bg = "#e65100" if cond.verdict == BUSY else "#757575"
    return (f" <span class='tk-busy' title='{html.escape(cond.reason, quote=True)}' style='background:{bg};"
            f"color:#fff;border-radius:8px;padding:0 6px;font-size:11px;font-weight:600'>⚠ {word}</span>")


def bound_html(rec) -> str:
    """A red '⚠ above the peak' pill (why on hover) for a record with a figure past its bound."""
    why = getattr(rec, "above_peak", None)
    if not why:
        return ""
    return (f" <span class='tk-bound' title='{html.escape(why, quote=True)}' style='background:#b00020;"
            f"color:#fff;border-radius:8px;padding:0 6px;font-size:11px;font-weight:600'>{WORDS}</span>")


def to_line(rec) -> str:
    """One line for `%gpuprofile on`, where every cell gets one."""
    parts = [f"⏱ {rec.name}{busy_badge(rec)}", fmt_seconds(rec.wall_s),
             f"CPU {fmt_bytes(rec.cpu_rss_delta_bytes, True)} (peak {fmt_bytes(rec.cpu_peak_delta_bytes, True)})"]
    if not is_missing(rec.gpu_peak_delta_bytes):
        parts.append(f"GPU {fmt_bytes(rec.gpu_alloc_delta_bytes, True)} "
                     f"(peak {fmt_bytes(rec.gpu_peak_delta_bytes, True)})")
    if rec.flops_source != "none" and rec.flops:
        bound = getattr(rec, "above_peak", None)
        # each figure its own part, a missing rate named ('TFLOPS n/a', not a bare 'n/a' after the FLOPs)
        speed = fmt_tflops(rec.tflops) if not is_missing(rec.tflops) else "TFLOPS " + fmt_tflops(rec.tflops)
        parts += [fmt_flops(rec.flops), mark(speed, rec.hfu, bound), mark("MFU " + fmt_pct(rec.mfu), rec.mfu, bound)]
        if bound:
            parts.append(f"{WORDS} ({bound})")
    if rec.error:
        parts.append(f"error: {rec.error}")
    elif rec.flops and is_missing(rec.tflops):
        why = of_kind(rec.notes, "rates.none")
        if why:
            parts.append(why[0])
    return " · ".join(parts)


class Summary:
    """What the magic displays: HTML in notebooks, text in terminals; `compact` is one line."""

    def __init__(self, rec, compact: bool = False):
        self.rec, self.compact = rec, compact

    def _repr_html_(self) -> str:
        if self.compact:
            style = "font-family:monospace;font-size:11px;color:#555"
            return f"<div style='{style}'>{html.escape(to_line(self.rec))}</div>"
        return to_html(self.rec)

    def __repr__(self) -> str:
        return to_line(self.rec) if self.compact else to_text(self.rec)


# --- tables: one way to print numbers (core.fmt.FORMATS), in the dashboard and the report --------


def machine_word(verdict) -> str:
    """The 'machine' column of a table: '⚠ busy' stands out, quiet stays plain."""
    if is_missing(verdict):
        return "n/a"
    return BUSY_CELL if verdict == BUSY else str(verdict)


def table_html(df) -> str:
    """A DataFrame as an HTML table with tunekit's number formats (by column header); a busy
    measurement's 'machine' cell is a visible orange badge."""
    formatters = {c: (lambda f: lambda v: formatted(v, f))(FORMATS[c]) for c in df.columns if c in FORMATS}
    text = [c for c in df.columns if df[c].dtype == object]  # pandas prints None there as 'None'
    df = df.assign(**{c: df[c].where(df[c].notna(), "n/a") for c in text}) if text else df
    out = df.to_html(index=False, formatters=formatters, na_rep="n/a", border=0, classes="tk")
    return TABLE_CSS + out.replace(f"<td>{BUSY_CELL}</td>", f"<td>{_BUSY_PILL}</td>")


def table_text(df) -> str:
    """The same table as aligned text, for a terminal."""
    formatters = {c: (lambda f: lambda v: formatted(v, f))(FORMATS[c]) for c in df.columns if c in FORMATS}
    text = [c for c in df.columns if df[c].dtype == object]
    df = df.assign(**{c: df[c].where(df[c].notna(), "n/a") for c in text}) if text else df
    return df.to_string(index=False, formatters=formatters, na_rep="n/a")


BUSY_CELL = f"⚠ {BUSY}"
_BUSY_PILL = ("<span class='tk-busy' title='measured while other work used the machine: not a measurement "
              "of the change' style='background:#e65100;color:#fff;border-radius:8px;padding:0 6px;"
              f"font-weight:600'>{BUSY_CELL}</span>")


# numbers line up under their headers in JupyterLab, VS Code and the report alike
TABLE_CSS = ("<style>table.tk{border-collapse:collapse}table.tk th,table.tk td{text-align:right;"
             "padding:2px 10px;white-space:nowrap}</style>")


_HISTORY = {"name": "cell", "wall_s": "time (s)", "gflop": "GFLOP", "flops_source": "FLOPs",
            "tflops": "TFLOPS", "mfu": "MFU", "hfu": "HFU", "mfu_peak": "MFU/HFU of",
            "cpu_peak_mib": "CPU peak above start (MiB)", "gpu_peak_mib": "GPU peak above start (MiB)",
            "conditions": "machine", "error": "error"}


# what tunekit.history() holds unless asked for every column: what ran, its time, FLOPs and rates
# (HFU judges TFLOPS against its bound), memory, the machine and the error (flops_source,
# above_peak and slowed_by: the view's marks; dtype and peak_tflops: the peak each row's MFU/HFU is against)
HISTORY_COLUMNS = ("name", "wall_s", "flops", "flops_source", "tflops", "mfu", "hfu", "dtype", "peak_tflops",
                   "cpu_peak_delta_bytes", "gpu_peak_delta_bytes", "conditions", "error", "above_peak", "slowed_by")


def history_view(df):
    """tunekit.history() with the columns a person reads first and units in the headers (those of
    them ``df`` has: the curated frame or every column)."""
    derived = {"error": ("error", lambda c: c.fillna("")), "gflop": ("flops", lambda c: c.astype(float) / 1e9),
               "conditions": ("conditions", lambda c: c.map(machine_word)),
               "cpu_peak_mib": ("cpu_peak_delta_bytes", lambda c: c.astype(float) / MiB),
               "gpu_peak_mib": ("gpu_peak_delta_bytes", lambda c: c.astype(float) / MiB)}
    view = df.assign(**{k: f(df[src]) for k, (src, f) in derived.items() if src in df})
    if "peak_tflops" in df and "dtype" in df:
        view = view.assign(mfu_peak=mfu_peaks(df["dtype"], df["peak_tflops"]))
    view = mark_rates(view, df["above_peak"] if "above_peak" in df else [None] * len(df))
    if "wall_s" in view:
        slowed = [slowed_by(r) for r in df.to_dict("records")]  # the counter/profiler ran in the timed cell
        view = view.assign(wall_s=[f"{formatted(t, FORMATS['time (s)'])} (slowed: {s})" if s else t
                                   for t, s in zip(view["wall_s"], slowed)])
    shown = [c for c in _HISTORY if c in view]
    return view[shown].rename(columns=_HISTORY)


def mfu_peaks(dtypes, peaks) -> list:
    """A table's 'MFU/HFU of' column: the peak each row's MFU and HFU are against, its own dtype's
    ('bf16 65 TFLOPS'; 'n/a' without one), so rows of several dtypes say what each figure means."""
    return [f"{d if isinstance(d, str) else ''} {fmt_tflops(p)}".strip() if not is_missing(p) else "n/a"
            for d, p in zip(dtypes, peaks)]


_RATES = (("mfu", "mfu", "MFU"), ("hfu", "hfu", "HFU"), ("tflops", "hfu", "TFLOPS"))  # column, judged by, format


def mark_rates(view, flags):
    """``view`` with the MFU/HFU/TFLOPS cells past their bound as text marked ⚠ ('150.0% ⚠'),
    in the rows whose record is flagged (``flags``: each row's ``above_peak``). Tables show the
    flag where the figure is; the DataFrame behind them keeps the raw numbers."""
    flagged = [isinstance(f, str) and f != "" for f in flags]
    if not any(flagged):
        return view
    cols = {}
    for col, judged, head in [x for x in _RATES if x[0] in view and x[1] in view]:
        cols[col] = [f"{formatted(v, FORMATS[head])} {FLAG}" if f and over(j) else v
                     for v, j, f in zip(view[col], view[judged], flagged)]
    return view.assign(**cols)



@functools.cache
def _readable_class():
    import pandas as pd

    class ReadableFrame(pd.DataFrame):
        """A pandas DataFrame like any other (raw numbers, the field names as columns); a notebook
        and a terminal show it as tunekit's readable table: thousands separators, MFU/HFU in %,
        units in the headers. Anything derived from it is a plain DataFrame."""

        _metadata = ["_tk_view", "_tk_more", "_tk_rest"]

        @property
        def _constructor(self):
            return pd.DataFrame

        def _footer(self) -> str:
            n = f"{len(self)} row" + ("" if len(self) == 1 else "s")
            more = getattr(self, "_tk_more", None)
            rest = getattr(self, "_tk_rest", None)
            return f"{n}; numbers formatted for reading, the DataFrame holds them raw" + \
                (f"; {more} has every column" if more else "") + (f"; {rest}" if rest else "")

        def _repr_html_(self) -> str:
            view = self._tk_view(pd.DataFrame(self))
            foot = html.escape(self._footer())
            return table_html(view) + f"<p style='color:#666;font-size:90%'>{foot}</p>"

        def __repr__(self) -> str:
            if self.empty:
                return "(no rows yet)"
            return table_text(self._tk_view(pd.DataFrame(self))) + "\n[" + self._footer() + "]"

        def __reduce_ex__(self, protocol):  # pickles as a plain DataFrame
            return pd.DataFrame, (pd.DataFrame(self),)

    return ReadableFrame


def readable(df, view, more: str | None = None, rest: str | None = None):
    """``df`` displayed in notebooks and terminals through ``view`` (e.g. ``history_view``), data
    unchanged; ``more``: the call that gives every column (said under the table); ``rest``: what
    is left out and how to see it, in words (said under it too)."""
    out = _readable_class()(df)
    out._tk_view, out._tk_more, out._tk_rest = view, more, rest
    return out
