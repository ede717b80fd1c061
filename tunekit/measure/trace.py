"""Trace one run with torch.profiler: time by op category, a memory timeline, a Chrome trace. Measurement layer.

    >>> tr = Tracer("step", trace=True, memory=True).start()
    >>> t0 = time.perf_counter(); step(); wall = time.perf_counter() - t0
    >>> breakdown, timeline = tr.stop(wall)            # core.breakdown.Breakdown / MemoryTimeline

Never run it around a FLOP-counted run (the counter's Python dispatch would be traced as the
work): `Probe` and the Lab trace a timed run. Each op is counted once, by its self time: on CPU
its self CPU time, on CUDA the kernels it launched itself; `core.breakdown.categorize` decides
its category from its chain of names. While tracing, every module's forward is wrapped in a
``nn.Module: <class>`` profiler range (a global module hook, removed at stop), so a generic op
knows which module ran it; an op of the backward pass inherits the chain of the forward op whose
autograd node it runs (matched by sequence number and name).

On CPU only the ops of the thread that started the trace count (a marker range at the start names
it): another thread's ops ran beside the block, not in its time. Python-function events
(``with_stack``, on under ``memory``) are not ops: the interpreter's time, which the breakdown
keeps as ``untraced_s`` (counted as ops, they once made a cell's shares add up to 200%, IPython's
history thread writing its SQLite cache during the cell among them). So the parts add up to the
wall time.
"""
from __future__ import annotations

import contextlib
import math
import os
import re
import time
from collections import defaultdict

import torch

from tunekit.core.breakdown import (
    CATEGORIES,
    IDLE,
    MEMORY_CATEGORIES,
    TOP_OPS,
    TORCH_MEMORY_CATEGORY,
    Breakdown,
    MemoryTimeline,
    categorize,
)
from tunekit.core.notes import Note, of_kind
from tunekit.core.paths import KEEP_SNAPSHOTS, KEEP_TRACES, prune, pruned_note, traces_dir
from tunekit.core.units import is_missing
from tunekit.measure.trace_ranges import ModuleRanges

NaN = math.nan
MARK = "tunekit: trace start"  # a zero-length range on the tracing thread: names the block's thread
MAX_TIMELINE_POINTS = 400  # enough for a chart; the JSONL log keeps the record small
_BACKWARD = re.compile(r"^(autograd::engine::evaluate_function: )?(\w+?)Backward\d*$")


def save_snapshot(name: str, folder=None) -> tuple[str | None, str | None]:
    """Dump the recorded CUDA allocator history under ``folder`` (else ``traces_dir()``):
    (path, None), or (None, why not)."""
    from tunekit.measure.torch_private import cuda_memory_snapshot

    folder = folder or traces_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        return cuda_memory_snapshot(folder / f"{_slug(name)}-{time.strftime('%Y%m%d-%H%M%S')}.pickle"), None
    except OSError as e:
        return None, f"no memory snapshot: {e}"


def prune_snapshots() -> str | None:
    """Keep the newest ``KEEP_SNAPSHOTS`` snapshots in ``traces_dir()``; the note of what went."""
    return pruned_note(prune(traces_dir(), "*.pickle", KEEP_SNAPSHOTS), "memory snapshots", KEEP_SNAPSHOTS)


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_")[:60] or "run"


@contextlib.contextmanager
def _quiet_kineto():
    # Kineto writes "USDT: ... profiler_start/stop" lines to the process' stderr on every trace
    # (a notebook shows them as errors). Its log level is read once, when the first profiler
    # starts; level 6 is above all of its levels. A level the user set is kept.
    if "KINETO_LOG_LEVEL" in os.environ:
        yield
        return
    os.environ["KINETO_LOG_LEVEL"] = "6"
    try:
        yield
    finally:
        os.environ.pop("KINETO_LOG_LEVEL", None)


class Tracer:
    """torch.profiler over one block: ``trace`` (time by category) and/or ``memory`` (timeline).

    ``cuda_index``: also trace that GPU's kernels (and, with ``memory``, dump a
    torch.cuda.memory snapshot for https://pytorch.org/memory_viz). Files go under
    ``folder``, else ``core.paths.traces_dir()``, where only the newest few are kept (the notes
    say what was removed)."""

    def __init__(self, name: str, trace: bool = True, memory: bool = False, cuda_index: int | None = None,
                 folder=None):
        if not (isinstance(trace, bool) and isinstance(memory, bool)):
            raise ValueError(f"trace and memory must be True or False, got {trace!r}, {memory!r}")
        self.name, self.trace, self.memory, self.index = name, trace, memory, cuda_index
        self.folder = folder
        self.prof = None

    def start(self) -> "Tracer":
        from torch.profiler import ProfilerActivity, profile

        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.index is not None else [])
        self.history = False
        if self.memory and self.index is not None:
            from tunekit.measure.torch_private import cuda_memory_history

            cuda_memory_history(True)
            self.history = True
        from tunekit.measure.torch_private import compiled_graphs

        # Dynamo guards on the global module hooks: installing them would recompile a compiled
        # model inside the traced run (and again after). Without them, generic ops lose the
        # module they ran in (a hand-written norm's ops count as elementwise).
        self.notes = []
        self.ranges = ModuleRanges()
        if not compiled_graphs():  # None (Dynamo never loaded) or 0 (nothing compiled yet)
            self.ranges.install()
        else:
            self.notes.append("torch.compile in use: no module scopes (their hooks would recompile), so "
                              "pointwise ops inside norm/attention modules count as elementwise")
        self.prof = profile(activities=acts, profile_memory=self.memory, record_shapes=self.memory,
                            with_stack=self.memory)
        self.log_level = None
        if self.memory:  # see torch_private.cpp_min_log_level: mute its stderr line while tracing
            from tunekit.measure.torch_private import cpp_min_log_level

            self.log_level = cpp_min_log_level(2)
        # record_function's first call in a process imports torch code; an import while the
        # memory profiler records Python frames garbles torch's event names (UnicodeDecodeError
        # when they are read): mark once before the trace starts, then the marker inside it
        _mark()
        try:
            with _quiet_kineto():
                self.prof.__enter__()
            _mark()
        except BaseException:
            self._cleanup()
            raise
        return self

    def _cleanup(self):
        self.ranges.remove()
        if self.log_level is not None:
            from tunekit.measure.torch_private import cpp_min_log_level

            cpp_min_log_level(self.log_level)
            self.log_level = None
        if self.history:
            from tunekit.measure.torch_private import cuda_memory_history

            self.history = False
            cuda_memory_history(False)

    def stop(self, wall_s: float) -> tuple[Breakdown | None, MemoryTimeline | None]:
        """Stop the profiler (always) and read it: (breakdown or None, timeline or None)."""
        snapshot = None
        try:
            self.ranges.close()   # inside the profiler's session, never after it
            self.prof.__exit__(None, None, None)
        finally:
            if self.history:
                snapshot = self._snapshot()
            self._cleanup()
        bd = tl = None
        if self.trace:
            bd = breakdown_from_events(self.prof.events(), wall_s, "cuda" if self.index is not None else "cpu")
            bd.notes.extend(self.notes)
            folder = self.folder or traces_dir()
            path = folder / f"{_slug(self.name)}-{time.strftime('%Y%m%d-%H%M%S')}-{id(self) % 10000:04d}.json"
            try:
                folder.mkdir(parents=True, exist_ok=True)
                self.prof.export_chrome_trace(str(path))
                bd.path = str(path)
            except OSError as e:  # a read-only or full disk costs the file, not the breakdown
                bd.notes.append(f"Chrome trace not written to {path}: {e}")
            if bd.path and not self.folder:
                note = pruned_note(prune(folder, "*.json", KEEP_TRACES), "Chrome traces", KEEP_TRACES)
                bd.notes.extend([note] if note else [])
            if self.memory:
                bd.notes.append("traced with the memory profiler on (shapes, stacks, allocations): "
                                "slower than a plain trace")
        if self.memory:
            tl = timeline_from_profile(self.prof, f"cuda:{self.index}" if self.index is not None else "cpu")
            tl.snapshot_path = snapshot
            tl.notes.extend(of_kind(self.notes, "trace.snapshot"))
            if self.index is None:
                tl.notes.append("no allocator snapshot on CPU (torch.cuda.memory snapshots are CUDA only)")
        return bd, tl

    def _snapshot(self):
        path, why_not = save_snapshot(self.name, self.folder)
        note = why_not or (None if self.folder else prune_snapshots())  # a folder you gave stays as it is
        self.notes.extend([Note("trace.snapshot", note)] if note else [])
        return path


# --- reading the events --------------------------------------------------------------------------


def _key(name: str) -> str:
    return name.rsplit("::", 1)[-1].replace("_", "").lower()


def _chains(events):
    """A function ``event -> chain of names`` (innermost first), backward ops extended with the
    chain of their forward op."""
    forward = defaultdict(list)  # sequence_nr -> forward ops carrying it
    for e in events:
        if getattr(e, "sequence_nr", -1) >= 0 and not _BACKWARD.match(e.name):
            forward[e.sequence_nr].append(e)
    cache = {}

    def own(e):
        out = []
        while e is not None:
            out.append(e.name)
            e = e.cpu_parent
        return out

    def chain(e):
        if id(e) in cache:
            return cache[id(e)]
        names, node = own(e), e
        while node is not None:  # the nearest autograd node above the op
            m = _BACKWARD.match(node.name)
            if m and getattr(node, "sequence_nr", -1) >= 0:
                ops = forward.get(node.sequence_nr, [])
                same = [f for f in ops if _key(f.name) == m.group(2).lower()]
                if same or ops:
                    names = names + own((same or ops)[-1])
                break
            node = node.cpu_parent
        cache[id(e)] = names
        return names

    return chain


def _is_device(e) -> bool:
    return getattr(getattr(e, "device_type", None), "name", "CPU") not in ("CPU",)


def breakdown_from_events(events, wall_s: float, device: str = "cpu", top: int = TOP_OPS) -> Breakdown:
    """Seconds by category of one traced run from torch.profiler's events (``prof.events()``).

    ``wall_s``: the run's wall time, measured by the caller around it."""
    chain = _chains(events)
    seconds = dict.fromkeys(c for c in CATEGORIES if c != IDLE or device == "cuda")
    seconds = {c: 0.0 for c in seconds}
    ops = defaultdict(lambda: [0.0, 0])
    notes = []
    cpu = [e for e in events if not _is_device(e) and not e.name.startswith("[") and e.name != MARK]
    if device == "cuda":
        kernel_s = 0.0
        for e in cpu:
            for k in getattr(e, "kernels", ()):
                cat = categorize([k.name] + chain(e))
                s = k.duration / 1e6
                seconds[cat] += s
                kernel_s += s
                ops[(e.name, cat)][0] += s
                ops[(e.name, cat)][1] += 1
        busy = _union_s([(e.time_range.start, e.time_range.end) for e in events if _is_device(e)])
        if busy is None:
            busy = kernel_s
            notes.append("no kernel timestamps: busy time taken as the sum of kernel times")
        if kernel_s > busy * 1.02:
            # several streams ran kernels at once: share the time some kernel ran among the
            # categories in proportion, so that they add up to it (and, with idle, to the wall)
            notes.append(f"kernels overlapped (several streams): their times add to {kernel_s / busy:.2f}x "
                         "the time some kernel ran; each category is scaled to its share of that time")
            for c in seconds:
                seconds[c] *= busy / kernel_s
        seconds[IDLE] = max(0.0, wall_s - busy)
        untraced = NaN
    else:
        mine = _block_thread(events)
        beside = defaultdict(float)
        for e in cpu:
            if getattr(e, "is_python_function", False):
                continue  # the interpreter's time: what untraced_s keeps
            s = e.self_cpu_time_total / 1e6
            if mine is not None and e.thread != mine:
                beside[e.name] += s
                continue
            cat = categorize(chain(e))
            seconds[cat] += s
            ops[(e.name, cat)][0] += s
            ops[(e.name, cat)][1] += 1
        if beside:
            most = max(beside, key=beside.get)
            notes.append(f"{sum(beside.values()) * 1e3:.3g} ms of ops on other threads ran beside the block "
                         f"(most: {most}): not part of its time, not in the shares")
        untraced = wall_s - sum(seconds.values())
    total = sum(seconds.values())
    if not is_missing(wall_s) and total > wall_s > 0:  # the profiler's window is a hair wider than our clock
        notes.append(f"the ops' times add to {total / wall_s:.3f}x the measured wall time: scaled to it")
        seconds = {c: s * wall_s / total for c, s in seconds.items()}
        untraced = 0.0 if not is_missing(untraced) else untraced
    rows = sorted(({"op": n, "category": c, "self_s": s, "calls": k} for (n, c), (s, k) in ops.items()),
                  key=lambda r: -r["self_s"])
    return Breakdown(device=device, wall_s=wall_s, seconds=seconds, top_ops=rows[:top], untraced_s=untraced,
                     notes=notes)


def _mark() -> None:
    with torch.autograd.profiler.record_function(MARK):
        pass


def _block_thread(events):
    """The profiler's id of the thread that ran the block (the one the start marker is on), or
    None without a marker (then every thread counts)."""
    for e in events:
        if e.name == MARK:
            return e.thread
    return None


def _union_s(intervals) -> float | None:
    """Seconds covered by a set of (start_us, end_us) intervals; None when there are none."""
    if not intervals:
        return None
    total, end = 0.0, -math.inf
    for a, b in sorted(intervals):
        if a > end:
            total += b - a
            end = b
        elif b > end:
            total += b - end
            end = b
    return total / 1e6


def timeline_from_profile(prof, device: str) -> MemoryTimeline:
    """Bytes alive by category through the run, from a profile taken with the memory profiler."""
    from tunekit.measure.torch_private import memory_timeline

    times_us, by_torch = memory_timeline(prof, device)
    cats = {c: [0] * len(times_us) for c in MEMORY_CATEGORIES}
    for torch_name, values in by_torch.items():
        ours = cats[TORCH_MEMORY_CATEGORY.get(torch_name, TORCH_MEMORY_CATEGORY[None])]
        for i, v in enumerate(values):
            ours[i] += v
    t0 = times_us[0] if times_us else 0
    times_s = [(t - t0) / 1e6 for t in times_us]
    keep = _thin(cats, len(times_s))
    return MemoryTimeline(device=device, times_s=[times_s[i] for i in keep],
                          bytes={c: [v[i] for i in keep] for c, v in cats.items()})


def _thin(cats, n: int) -> list:
    """At most MAX_TIMELINE_POINTS indices, evenly spread, always keeping the peak and the ends."""
    if n <= MAX_TIMELINE_POINTS:
        return list(range(n))
    totals = [sum(v[i] for v in cats.values()) for i in range(n)]
    peak = max(range(n), key=totals.__getitem__)
    step = n / (MAX_TIMELINE_POINTS - 2)
    return sorted({0, n - 1, peak, *(int(k * step) for k in range(MAX_TIMELINE_POINTS - 2))})
