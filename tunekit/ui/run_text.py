"""A RunResult as a few readable lines: what ``tunekit run`` prints. UI layer, formatting only."""
from __future__ import annotations

from ..core.baseline import comm_lines, layout
from ..core.bounds import WORDS, mark
from ..core.summary import FORMATS, formatted
from ..core.units import fmt_bytes, fmt_pct, fmt_seconds


def summary_lines(r) -> list[str]:
    """A RunResult as a few readable lines (the formats of the dashboard and the report)."""
    cond = getattr(r, "conditions", None)
    busy = cond is not None and cond.busy
    head = f"run #{r.run_id} {r.label} · {r.model} · {r.device}" + (" · ⚠ BUSY MACHINE" if busy else "")
    if r.status != "ok":
        return [head, f"  FAILED: {r.error}"]
    rows = [("speed", f"{formatted(r.tokens_per_s, FORMATS['tokens/s'])} tokens/s · step {fmt_seconds(r.step_s)} "
                      f"(min {fmt_seconds(r.step_s_min)}, max {fmt_seconds(r.step_s_max)}) over {r.steps} steps"),
            ("compute", f"{mark(formatted(r.tflops, FORMATS['TFLOPS']) + ' TFLOPS', r.hfu, r.above_peak)} · "
                        f"{mark('MFU ' + fmt_pct(r.mfu), r.mfu, r.above_peak)} · "
                        f"{mark('HFU ' + fmt_pct(r.hfu), r.hfu, r.above_peak)} of "
                        f"{formatted(r.peak_tflops, '{:.4g}')} TFLOPS [{r.peak_tflops_source}]"
                        + (f" · {WORDS}: {r.above_peak}" if r.above_peak else "")),
            ("memory", f"peak {fmt_bytes(r.peak_mem_bytes)} ({r.peak_mem_source}) · params {fmt_bytes(r.params_bytes)}"
                       f" · grads {fmt_bytes(r.grads_bytes)} · optimizer {fmt_bytes(r.optimizer_bytes)}"),
            ("loss", f"{formatted(r.loss_first, FORMATS['loss'])} -> {formatted(r.loss, FORMATS['loss'])}")]
    if cond is not None:
        rows.append(("machine", f"{cond}" + (": these figures measure the other work too, not the "
                                             "configuration; re-run when it is quiet" if busy else "")))
    if getattr(r, "world_size", None):   # distributed runs only
        rows += [("layout", layout(r))] + [("comm", f"per step, {x}") for x in comm_lines(r.comm)]
    rows += [("note", n) for n in r.notes]
    return [head] + [f"  {k:<8} {v}" for k, v in rows]
