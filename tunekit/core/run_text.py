"""A run, a Lab and an autotune search as a few aligned lines: what ``print(r)``, ``print(lab)``,
``print(found)`` and ``tunekit run`` show, and the same as HTML in a notebook. Pure formatting
(records are read by attribute): no torch, no measuring.

    >>> print("\\n".join(summary_lines(r)))
    run #0 baseline · GPT 426.6k params · cpu (2 threads)
      speed    1,062 tokens/s · step 96.4 ms (min 96.0 ms, max 97.1 ms) over 5 steps
      ...
    >>> result_line(r)     # the line lab.run ends with
    'run #0 baseline · 1,062 tokens/s · step 96.4 ms · MFU 1.5% · peak 378.5 MiB · quiet'
"""
from __future__ import annotations

import html
import re

from tunekit.core.baseline import comm_lines, layout
from tunekit.core.bounds import WORDS, mark
from tunekit.core.fmt import FORMATS, fmt_bytes, fmt_count, fmt_elapsed, fmt_pct, fmt_rate, fmt_seconds, formatted
from tunekit.core.summary import badge_html, bound_html, lines_html, lines_text, with_notes
from tunekit.core.units import is_missing


def unit_of(r) -> str:
    """What a run's throughput counted: "tokens", or "samples" for a batch with no sequence
    dimension (``RunResult.throughput_unit``; records written before it counted tokens)."""
    return "samples" if getattr(r, "throughput_unit", None) == "samples" else "tokens"


def common_unit(units) -> str:
    """The unit of a column of throughputs: "tokens", "samples", or "tokens or samples" when the
    runs differ (missing values, from older logs, are tokens)."""
    seen = {"samples" if u == "samples" else "tokens" for u in units}
    return seen.pop() if len(seen) == 1 else "tokens" if not seen else "tokens or samples"


def rate(r) -> str:
    """'12,345 tokens/s' (or samples/s)."""
    return fmt_rate(r.tokens_per_s, f"{unit_of(r)}/s")


def short_source(s) -> str:
    """A meter's or peak's source without its explanation: 'CPU process RSS peak (VmHWM): includes
    ...' -> 'CPU process RSS peak'; 'calibrated MAMF on X, fp32, ...' -> 'calibrated MAMF on X'."""
    return re.split(r": (?=[a-z])|, | \(", str(s))[0] if s else "n/a"


# --- one run (core.results.RunResult) -----------------------------------------------------------


def run_head(r) -> str:
    model = f"{r.model} {fmt_count(r.n_params)} params" if not is_missing(getattr(r, "n_params", None)) else r.model
    return f"run #{r.run_id} {r.label} · {model} · {r.device}"


def run_rows(r) -> list[tuple[str, str]]:
    """(label, value) rows of a run: speed, compute, memory, loss, machine, layout, notes."""
    cond = getattr(r, "conditions", None)
    if r.status != "ok":
        rows = [("FAILED", str(r.error))]
        if cond is not None:
            rows.append(("machine", str(cond)))
        return with_notes(rows, r.notes, 1)
    rows = [("speed", f"{rate(r)} · step {fmt_seconds(r.step_s)} (min {fmt_seconds(r.step_s_min)}, "
                      f"max {fmt_seconds(r.step_s_max)}) over {r.steps} steps"),
            ("compute", f"{mark(formatted(r.tflops, FORMATS['TFLOPS']) + ' TFLOPS', r.hfu, r.above_peak)} · "
                        f"{mark('MFU ' + fmt_pct(r.mfu), r.mfu, r.above_peak)} · "
                        f"{mark('HFU ' + fmt_pct(r.hfu), r.hfu, r.above_peak)} of "
                        f"{formatted(r.peak_tflops, '{:.4g}')} TFLOPS [{short_source(r.peak_tflops_source)}]"
                        + (f" · {WORDS}: {r.above_peak}" if r.above_peak else "")),
            ("memory", f"peak {fmt_bytes(r.peak_mem_bytes)} ({short_source(r.peak_mem_source)}) · params "
                       f"{fmt_bytes(r.params_bytes)} · grads {fmt_bytes(r.grads_bytes)} · optimizer "
                       f"{fmt_bytes(r.optimizer_bytes)}"),
            ("loss", f"{formatted(r.loss_first, FORMATS['loss'])} -> {formatted(r.loss, FORMATS['loss'])}")]
    if getattr(r, "explained", None):   # a traced run against its expected step (tunekit.explain's line)
        rows.append(("traced", r.explained))
    machine = [] if cond is None else [f"{cond}" + ("; these figures measure the other work too: re-run "
                                                     "when it is quiet" if cond.busy else "")]
    if getattr(r, "wait_policy", None):   # a CPU run's: its small matmuls' speed follows it
        machine.append(f"OpenMP wait policy {r.wait_policy}")
    if machine:
        rows.append(("machine", " · ".join(machine)))
    if getattr(r, "world_size", None):   # distributed runs only
        rows += [("layout", layout(r))] + [("comm", f"per step, {x}") for x in comm_lines(r.comm)]
    job = getattr(r, "job", None)
    if isinstance(job, dict):             # a cluster run: where it ran
        rows.append(("job", f"{job.get('engine', 'cluster')} job {job.get('id')} on {job.get('nodes')} "
                            f"(partition {job.get('partition')}): {job.get('state')}"))
    return with_notes(rows, r.notes, 1)


def summary_lines(r) -> list[str]:
    """A RunResult as at most a dozen aligned lines: ``print(r)`` and ``tunekit run``."""
    cond = getattr(r, "conditions", None)
    busy = " · ⚠ BUSY MACHINE" if cond is not None and cond.busy else ""
    return lines_text(run_head(r) + busy, run_rows(r)).splitlines()


def run_html(r) -> str:
    """The same as HTML (a notebook's ``r``), the busy and above-the-peak badges as pills."""
    color = "#b00020" if r.status != "ok" else "#555"
    return lines_html(html.escape(run_head(r)) + badge_html(getattr(r, "conditions", None)) + bound_html(r),
                      run_rows(r), color)


def result_line(r) -> str:
    """One line: what ``lab.run`` says when it ends."""
    cond = getattr(r, "conditions", None)
    machine = "" if cond is None else f" · {'⚠ busy' if cond.busy else cond.verdict}"
    if r.status != "ok":
        return f"run #{r.run_id} {r.label} · FAILED: {r.error}{machine}"
    return (f"run #{r.run_id} {r.label} · {rate(r)} · step {fmt_seconds(r.step_s)} · "
            f"{mark('MFU ' + fmt_pct(r.mfu), r.mfu, r.above_peak)} · peak {fmt_bytes(r.peak_mem_bytes)}{machine}")


# --- a Lab ----------------------------------------------------------------------------------------

_SHOWN = ("precision", "micro_batch", "grad_accum", "seq_len", "optimizer", "attention", "checkpointing",
          "compile")


def lab_rows(model: str, n_params, device: str, toggles: dict, data: str, runs: list, log) -> list:
    """(label, value) rows of a Lab: its model, the toggles every run starts from, its runs."""
    rows = [("model", f"{model} · {fmt_count(n_params)} params · {device} · {data}"),
            ("toggles", " · ".join(f"{k} {toggles[k]}" if not isinstance(toggles[k], bool) else k
                                   for k in _SHOWN if toggles.get(k) not in (None, False)))]
    ok = [r for r in runs if r.status == "ok"]
    if runs:
        rows.append(("runs", f"{len(runs)} ({len(runs) - len(ok)} failed)" if len(ok) < len(runs) else str(len(runs))))
        rows.append(("last", result_line(runs[-1])))
        if ok:
            best = max(ok, key=lambda r: -1 if is_missing(r.tokens_per_s) else r.tokens_per_s)
            if best is not runs[-1]:
                rows.append(("fastest", result_line(best)))
    else:
        rows.append(("runs", "none yet: lab.run(steps=20, precision='bf16', ...)"))
    rows.append(("log", str(log)))
    rows.append(("see", "lab.results() · lab.compare() · lab.dashboard() · lab.autotune() · lab.plan(device)"))
    return rows


def lab_text(rows) -> str:
    return lines_text("tunekit Lab", rows)


def lab_html(rows) -> str:
    return lines_html("tunekit Lab", rows)


# --- an autotune search (autotune.AutotuneResult) -------------------------------------------


def autotune_rows(found) -> list[tuple[str, str]]:
    """(label, value) rows of an AutotuneResult: winner, its gain, the noise, the machine, state."""
    from tunekit.core.toggles import label

    measured = [c for c in found.candidates if c.runs]
    win = next((c for c in found.candidates if c.status == "winner"), None)
    base = next((c for c in measured if c.toggles == found.start), None)
    unit = common_unit(unit_of(r) for c in measured for r in c.runs)
    rows = [("search", f"{len(found.candidates)} candidates, {len(measured)} measured · "
                       f"{fmt_elapsed(found.elapsed_s)} of {found.budget_s:g} s · {found.status}")]
    if win is None:
        rows.append(("winner", "none: nothing was measured"))
    else:
        gain = f" · {win.score / base.score:.2f}x the start" if base is not None and base is not win else \
            (" · the start stays" if base is win else "")
        rows.append(("winner", f"{label(win.toggles, found.start)} at {fmt_rate(win.score, f'{unit}/s')}{gain}"))
    if found.inconclusive:
        rows.append(("judged", f"INCONCLUSIVE: {len(found.tied)} within the noise band ±{fmt_pct(found.band, 0)}: "
                               "the winner is the incumbent kept, not shown fastest"))
    elif found.within_noise and found.runner_up is not None:
        rows.append(("judged", f"within noise (±{fmt_pct(found.band, 0)}) of {label(found.runner_up, found.start)}"))
    elif win is not None and len(measured) > 1:
        rows.append(("judged", f"beyond the noise band ±{fmt_pct(found.band, 0)}"))
    elif win is not None:
        rows.append(("judged", "nothing to compare it with: one candidate measured"))
    rows.append(("machine", found.machine.removeprefix("Machine: ")))
    rows.append(("state", found.state))
    if found.partial:
        rows.append(("partial", "STOPPED EARLY: budget spent" if found.status == "budget" else "INTERRUPTED"))
    rows = with_notes(rows, found.notes, 2)
    return rows + [("see", "found.verdict · found.evidence · found.figure")]


def autotune_line(found) -> str:
    """One line: what ``lab.autotune`` says when it ends (the winner, then the search)."""
    rows = dict(autotune_rows(found))
    win = rows["winner"].replace("none:", "no winner:") if rows["winner"].startswith("none") else \
        "winner " + rows["winner"]
    return " · ".join(["autotune: " + win, rows["search"]] + ([rows["partial"]] if "partial" in rows else []))


def autotune_text(found) -> str:
    return lines_text("autotune", autotune_rows(found))


def autotune_html(found) -> str:
    cond = found.conditions
    return lines_html("autotune" + badge_html(cond), autotune_rows(found))
