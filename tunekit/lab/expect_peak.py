"""lab.expect's peak memory (lab.expect): the plan's peak corrected by what the base run measured beyond
its plan (`peak_of`) and, on a CPU, the memory a kernel library keeps once per process for the
kernels tunekit's steps in this process have not run yet (`first_use_of`: oneDNN's JIT code and
primitive cache per matmul shape, a dtype's first matmul and attention; measure.first_use).

What ran is tracked where the Lab runs its steps (``Lab.train_step`` calls `stepped`): each step's
toggles, resolved to its plan's matmul and attention kernels (planning.expect.kernel_keys) when
lab.expect next asks, for every Lab of this process still alive. What code of your own outside
tunekit ran in this process is not known: a kernel it ran counts as new (note ``expect.first_use``).
"""
from __future__ import annotations

import math
import weakref

from tunekit.core.fmt import fmt_bytes
from tunekit.core.notes import Note
from tunekit.core.units import is_missing

NaN = math.nan
_RAN: set = set()      # kernel keys (planning.expect.kernel_keys) tunekit's steps in this process ran
_STEPPING: "weakref.WeakSet" = weakref.WeakSet()   # Labs with steps not yet resolved to kernels


def stepped(lab, t) -> None:
    """Keep the toggles ``t`` a step of ``lab`` ran under (once per toggles: a set lookup a step)."""
    seen = lab.__dict__.setdefault("_stepped", {})
    if t not in seen:
        seen[t] = False            # not yet resolved to its plan's kernels
        _STEPPING.add(lab)


def ran_kernels() -> set:
    """The kernel keys tunekit's steps in this process ran: each Lab's stepped toggles not yet
    resolved are planned now (`cached_plan`: once per shape, mostly planned already by lab.expect),
    on a CPU Lab; a setting that cannot be planned adds nothing."""
    from tunekit.core.setting import Setting
    from tunekit.lab.explain import plan_device
    from tunekit.lab.plan import cached_plan
    from tunekit.planning.target import lab_setting

    for lab in list(_STEPPING):
        seen = lab.__dict__.get("_stepped", {})
        for t in [t for t, done in list(seen.items()) if not done]:   # a step may add one meanwhile
            seen[t] = True
            if lab.device.type != "cpu":
                continue
            try:
                plan = cached_plan(lab, plan_device(str(lab.device)), Setting(**lab_setting(lab, **t.asdict())))
            except (ValueError, TypeError, RuntimeError):   # not plannable: its kernels are not known
                continue
            _RAN.update(getattr(plan.expected, "kernels", ()) if plan.expected is not None else ())
        if all(seen.values()):
            _STEPPING.discard(lab)
    return _RAN


def _dtype(signature: str) -> str | None:
    """A kernel's dtype (core.registry's name) by its first input's dtype: "bfloat16" -> "bf16"."""
    from tunekit.core import registry

    try:
        return registry.dtype(signature.split(">")[0].split(",")[0]).name
    except ValueError:
        return None


def first_use_bytes(kernels, ran, figures: dict) -> tuple[float, list]:
    """(bytes, the new kernels) a step of ``kernels`` adds to the process's floor where it already ran
    ``ran`` (kernel keys): per dtype whose matmuls (attention) none of ``ran`` ran, its
    ``dtype_bytes`` (``attention_bytes``); per new matmul kernel, its dtype's ``shape_bytes``.
    ``figures``: {dtype: {...}} (measure.first_use); a dtype without figures adds nothing."""
    new = sorted(set(kernels) - set(ran), key=repr)
    old = {(k[0], _dtype(k[1])) for k in ran}
    total = 0.0
    for kind, d in sorted({(k[0], _dtype(k[1])) for k in new}, key=repr):
        f = figures.get(d)
        if f is not None and (kind, d) not in old:
            total += f["dtype_bytes"] if kind == "matmul" else f["attention_bytes"]
    total += sum(figures[d]["shape_bytes"] for k in new if k[0] == "matmul" and (d := _dtype(k[1])) in figures)
    return total, new


def new_kernels(lab, plan) -> bool:
    """Whether ``plan`` runs kernels tunekit's steps in this process have not (on a CPU: `first_use_of` adds)."""
    kernels = getattr(getattr(plan, "expected", None), "kernels", None)
    return lab.device.type == "cpu" and bool(kernels) and bool(set(kernels) - ran_kernels())


def prepare_first_use(lab, plan, shown) -> None:
    """Measure this CPU's first-use figures where `first_use_of` will need them and no cache holds them
    (a few seconds per dtype, once per machine and torch), with a stage on ``shown``'s progress line."""
    if new_kernels(lab, plan):
        from tunekit.measure.first_use import measure_first_use
        shown.at("this CPU's first-use memory of its kernels (measured once in child processes, then cached)")
        measure_first_use()


def first_use_of(lab, plan) -> tuple[float, list]:
    """(bytes, notes): what the kernel library keeps once per process for the kernels of ``plan`` that
    tunekit's steps in this process have not run (`first_use_bytes`, this CPU's measured figures); 0
    off a CPU or where the plan names no kernels."""
    if not new_kernels(lab, plan):
        return 0.0, []
    from tunekit.measure.first_use import measure_first_use

    measured = measure_first_use()
    extra, new = first_use_bytes(plan.expected.kernels, ran_kernels(), measured["figures"])
    if not extra > 0:
        return 0.0, []
    kinds = sorted({f"{_dtype(k[1])} {k[0]}" for k in new})
    return extra, [Note("expect.first_use", f"{len(new)} matmul and attention kernels tunekit's steps in this "
                                            f"process have not run ({', '.join(kinds)}): +{fmt_bytes(extra)} the "
                                            "kernel library keeps once per process (oneDNN's code and primitives, "
                                            f"this CPU's measured figures, {measured['verdict']}: measure.first_use); "
                                            "what code of your own outside tunekit ran here is not known")]


HELD = ("weights", "master_weights", "optimizer_states", "buffers")   # plan components kept between steps


def held_bytes(plan) -> float:
    """What a plan's step keeps from one step to the next (weights, master weights, optimizer states,
    buffers): held already as a run's timed steps start; NaN when the plan has no components."""
    comps = getattr(plan, "components", None)
    if not comps:
        return NaN
    return float(sum(comps.get(k, 0.0) for k in HELD if not is_missing(comps.get(k, 0.0))))


def lab_floor_bytes(lab) -> float:
    """The process without the Lab's step: its RSS settled now (measure.device_meter: glibc hands its
    freed heap pages back, ~10 ms, and RSS is what a run's meter would read at its start) less the
    tensors the Lab holds (weights, buffers, gradients left, optimizer states): Python, torch, the
    data and whatever else the process keeps. It grows over a session (a first traced run: ~20 MiB)."""
    from tunekit.measure.device_meter import settled_rss_bytes
    from tunekit.measure.tally import unique_bytes

    model, opt = lab.model, getattr(lab, "optimizer", None)
    states = [v for st in (opt.state.values() if opt is not None else ()) for v in st.values()]
    held = unique_bytes([*model.parameters(), *model.buffers(), *(p.grad for p in model.parameters()), *states])
    return float(settled_rss_bytes() - held)


def peak_of(lab, plan, run, base_plan, floor=None) -> tuple[float, float, list]:
    """(expected peak bytes, the base's peak, notes): the plan's peak corrected by what the base
    run measured beyond its plan. GPU: a ratio (the allocator's peak over the plan's). CPU, where
    the run kept its meter's start (``peak_mem_start_bytes``, RSS once glibc's freed heap pages
    were handed back): the process's floor as it is now (``floor``: `lab_floor_bytes`), plus what
    the setting keeps between steps (the plan's), plus what its steps add (the plan's transient:
    its peak less what is kept) and the base run's unplanned part of that, scaled by the tokens of
    one micro-batch: what the steps touched beyond the fake step's tensors (allocator holes and
    pages no tensor accounts for) followed the tokens on cpu-tiny, not the activations: ~21 MiB at
    1,024 tokens (24 with checkpointing, which drops 85% of the activations), 41-44 at 2,048, 12
    at 512 (benchmarks/bench_cpu_peak.py). Without a start reading: one offset, measured - planned.
    Without a run: the plan's peak, on a CPU above the process's floor (what lab.run's meter reads).
    On a CPU each adds the bytes a kernel library keeps once per process for the setting's kernels
    not yet run here (`first_use_of`)."""
    planned = plan.total_bytes
    first, first_notes = first_use_of(lab, plan) if lab.device.type == "cpu" else (0.0, [])
    if run is None:   # on a CPU the run's meter reads the process: the floor is on both sides
        below = (lab_floor_bytes(lab) if floor is None else floor) if lab.device.type == "cpu" else 0.0
        return below + planned + first, below + base_plan.total_bytes, first_notes
    measured = run.peak_mem_bytes
    if measured is None or is_missing(measured) or not measured > 0 or not base_plan.total_bytes > 0:
        return planned, NaN, [Note("expect.peak_uncalibrated", f"run #{run.run_id} measured no peak: the "
                                                                "plan's fake-step peak alone")]
    if lab.device.type != "cpu":
        return planned * measured / base_plan.total_bytes, measured, []
    start = getattr(run, "peak_mem_start_bytes", None)
    kept, base_kept = held_bytes(plan), held_bytes(base_plan)
    if start is None or is_missing(start) or is_missing(kept) or is_missing(base_kept):
        return planned + (measured - base_plan.total_bytes) + first, measured, [Note(
            "expect.peak_offset", f"run #{run.run_id} kept no start reading of its peak meter: what it measured "
                                  "beyond its plan is carried as one offset"), *first_notes]
    if floor is None:
        try:
            floor = lab_floor_bytes(lab)
        except RuntimeError:   # the optimizer's state changed under the reading (a step in another thread)
            floor = start - base_kept   # the process as the base run found it
    unplanned = (measured - start) - (base_plan.total_bytes - base_kept)
    tokens = _tokens(plan) / _tokens(base_plan) if _tokens(base_plan) else 1.0
    return floor + planned + unplanned * tokens + first, measured, first_notes


def _tokens(plan) -> float:
    s = getattr(plan, "setting", None)   # a model counting samples (its own batch_fn): seq_len is not its size
    if s is not None and s.micro_batch and getattr(plan, "unit", "tokens") == "samples":
        return float(s.micro_batch)
    return float(s.micro_batch * s.seq_len) if s is not None and s.micro_batch and s.seq_len else 0.0


