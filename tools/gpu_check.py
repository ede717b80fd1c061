"""Every CUDA path of tunekit against the device's own figures, in one run (issue 32).

The one command to run on a lent GPU, from the repository root (the device tool's ``run`` with
timeout_s=480; nothing to install or carry: the image has torch, transformers, pandas, psutil and
nvidia-ml-py, and tunekit is imported from the checkout):

    set -o pipefail; PYTHONUNBUFFERED=1 python3 tools/gpu_check.py --out $OUT 2>&1 | tee $OUT/gpu_check.log

It stops itself within 455 s (``--budget-s``, default 430, then at most 25 s for a hung call: a
watchdog writes the report and exits 3), which leaves the 15-minute lease room for one rerun of
what failed, e.g. ``--only plan,lab --budget-s 200`` with timeout_s=240. Every section has its own
time limit too; one that overruns is recorded as skipped with its reason and the rest still run. It
writes ``gpu_check.json`` and ``gpu_check.md`` under ``--out`` (default ``$OUT``, else
``build/gpu_check``) after every section, so a killed run still leaves what it had. Each check
is measured vs expected, pass/fail, with its figures. Sections:

- device:      versions, and the calibrated bf16 MAMF against a timed 8192-cube matmul and ~790 TFLOPS
- profile:     ``tunekit.profile`` (the magic's probe, no IPython) on a GPT-2-124M bf16 step:
               time vs CUDA events, TFLOPS, MFU vs the MAMF, allocated/peak/reserved vs torch.cuda,
               NVML used memory, NVML energy
- monitor:     ``tunekit.Monitor`` in a plain loop: per-step times vs CUDA events, its overhead
- conditions:  NVML other processes and throttle reasons, quiet, then busy beside a second process
- fsdp:        ``lab.run(parallel="fsdp", nproc=1)``: one NCCL rank through the ranks' code
- plan:        ``tunekit.plan`` vs the real step: GPT-2 124M, a ~1B Llama, Llama-3 8B (checkpointing,
               1 x 8192): planned peak vs max_memory_allocated / reserved, bound (and expected) vs time
- lab:         every toggle on CUDA (the ladder in one table), then ``find_max_batch_size`` to a real OOM
- expect:      ``lab.expect`` calibrated by a traced bf16 base run, then each rung of a small ladder
               (checkpointing, micro-batch x2, SGD, SDPA math) expected first and measured after:
               step and peak error (CPU: judged by benchmarks/bench_expect.py instead)

``--dry-run`` runs every step it can on the CPU with small shapes (what needs CUDA is recorded as
skipped, with why); ``make test`` runs it (tests/project/test_gpu_check.py). IPython, ipywidgets and
plotly are blocked from import here, as on the device image, which has none of them.
Exit status: 0 all passed or skipped, 1 a check failed, 2 a section raised, 3 the watchdog ended it.
"""
from __future__ import annotations

import argparse
import datetime
import gc
import importlib.abc
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK_PACKAGES = ("IPython", "ipywidgets", "plotly")
# TFLOPS: an 8192-cube bf16 matmul measured 2026-11 on an H100 80GB HBM3 (SXM) and an H200 141GB, torch
# 2.11.0+cu130, ran at 769-798 TFLOP/s (benchmarks/RESULTS.md)
MAMF_EXPECTED = 790.0
SECTIONS = ("device", "profile", "monitor", "conditions", "fsdp", "plan", "lab", "expect")
LIMITS_S = dict(device=35, profile=40, monitor=35, conditions=35, fsdp=60, plan=150, lab=180, expect=90)   # CUDA, s
BUDGET_S = 430.0   # the whole run: the watchdog ends it 25 s later at most, inside 8 minutes
WATCHDOG_S = 25.0


class _NoNotebook(importlib.abc.MetaPathFinder):
    """The device image has no IPython, ipywidgets or plotly: neither may this run."""

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in NOTEBOOK_PACKAGES:
            raise ModuleNotFoundError(f"No module named {name!r} (blocked by gpu_check: not on the device)",
                                      name=name)
        return None


class SectionTimeout(Exception):
    pass


# --- the report ------------------------------------------------------------------------------

def clean(v):
    """JSON-safe: NaN/inf -> None, numpy/torch scalars -> float, the rest as text."""
    if isinstance(v, dict):
        return {str(k): clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [clean(x) for x in v]
    if v is None or isinstance(v, (bool, str, int)):
        return v
    try:
        f = float(v)
    except (TypeError, ValueError):
        return str(v)
    return f if math.isfinite(f) else None


def within(measured, expected, rel) -> bool | None:
    """|measured / expected - 1| <= rel; None when either is missing."""
    try:
        m, e = float(measured), float(expected)
    except (TypeError, ValueError):
        return None
    if not (math.isfinite(m) and math.isfinite(e)) or e == 0:
        return None
    return abs(m / e - 1) <= rel + 1e-12   # 105 vs 100 is within 5% whatever the rounding of 105/100


def ratio(a, b):
    try:
        return float(a) / float(b) if float(b) else None
    except (TypeError, ValueError):
        return None


class Section:
    def __init__(self, name):
        self.name, self.status, self.reason, self.seconds, self.limit_s = name, "pending", "", 0.0, None
        self.checks, self.tables = [], []
        self.doing = ""   # what the section is at (a timeout names it)

    def check(self, name, measured, expected, ok, note="", **figures):
        """One check; ``ok`` None means skipped (``note`` says why)."""
        self.checks.append(dict(name=name, measured=clean(measured), expected=expected,
                                result="skipped" if ok is None else "pass" if ok else "fail",
                                note=note, figures=clean(figures)))
        print(f"  [{self.checks[-1]['result']:>7}] {name}: {_short(measured)} vs {expected}"
              + (f" ({note})" if note else ""), flush=True)

    def skip(self, name, why, **figures):
        self.check(name, None, "-", None, why, **figures)

    def finish(self):
        if self.status in ("error", "skipped"):
            return
        results = {c["result"] for c in self.checks}
        self.status = "fail" if "fail" in results else "pass" if "pass" in results else "skipped"
        if self.status == "skipped" and not self.reason:
            self.reason = "every check was skipped: " + "; ".join(dict.fromkeys(c["note"] for c in self.checks))

    def to_dict(self):
        return dict(name=self.name, status=self.status, reason=self.reason, seconds=round(self.seconds, 2),
                    limit_s=self.limit_s, checks=self.checks, tables=self.tables)


def _short(v):
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)[:80]


class Report:
    def __init__(self, out: Path, mode: str):
        self.out, self.mode, self.env, self.sections = out, mode, {}, []
        self.started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        self.lock = threading.Lock()

    def summary(self):
        return {s: sum(x.status == s for x in self.sections) for s in ("pass", "fail", "skipped", "error", "pending")}

    def write(self):
        with self.lock:
            self.out.mkdir(parents=True, exist_ok=True)
            data = dict(tool="tools/gpu_check.py", issue=32, mode=self.mode, started=self.started,
                        environment=clean(self.env), summary=self.summary(),
                        sections=[s.to_dict() for s in self.sections])
            (self.out / "gpu_check.json").write_text(json.dumps(data, indent=1) + "\n")
            (self.out / "gpu_check.md").write_text(markdown(data))


def _cell(v):
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v).replace("|", "/").replace("\n", " ")


def md_table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def markdown(d) -> str:
    env = d["environment"]
    out = [f"# tunekit GPU check ({d['mode']})", "",
           f"Started {d['started']} UTC. " + ", ".join(f"{k}: {v}" for k, v in env.items()), "",
           "Summary: " + ", ".join(f"{v} {k}" for k, v in d["summary"].items() if v), ""]
    for s in d["sections"]:
        out += [f"## {s['name']}: {s['status']}" + (f" ({s['reason']})" if s["reason"] else ""), "",
                f"{s['seconds']:.1f} s of a {s['limit_s']} s limit.", ""]
        if s["checks"]:
            rows = [(c["name"], c["measured"], c["expected"], c["result"],
                     "; ".join([c["note"]] * bool(c["note"]) + [f"{k}={_cell(v)}" for k, v in c["figures"].items()]))
                    for c in s["checks"]]
            out += [md_table(("check", "measured", "expected", "result", "figures / why"), rows), ""]
        for t in s["tables"]:
            out += [f"**{t['title']}**", "", md_table(t["header"], t["rows"]), ""]
    return "\n".join(out)


# --- the run ---------------------------------------------------------------------------------

class Run:
    """What every section shares: torch, tunekit, the device, the sizes, the clock."""

    def __init__(self, args):
        import torch

        import tunekit

        self.torch, self.tk, self.args = torch, tunekit, args
        self.cuda = torch.cuda.is_available() and not args.dry_run
        self.dev = "cuda" if self.cuda else "cpu"
        self.threads_before = torch.get_num_threads()
        if not self.cuda:   # tiny ops on a shared CPU: one thread does not wait on the others
            torch.set_num_threads(1)
        self.dry = not self.cuda
        self.no_cuda = "no CUDA (dry run on the CPU)" if args.dry_run else "no CUDA device here"
        self.cal = None   # the bf16 MAMF (device section)
        self.gpu_name = torch.cuda.get_device_name() if self.cuda else None
        # sizes: the issue's on CUDA, small ones on the CPU (the same code paths)
        self.gpt = "gpt2-124m" if self.cuda else "cpu-tiny"
        self.gpt_mb, self.gpt_seq = (16, 1024) if self.cuda else (2, 64)
        self.steps = 8 if self.cuda else 1   # timed steps of a Lab run

    @property
    def peak(self):
        """The calibrated MAMF where there is one (on the CPU it spares every API a calibration)."""
        return self.cal.tflops if self.cal is not None else None

    def sync(self):
        if self.cuda:
            self.torch.cuda.synchronize()

    def free(self):
        gc.collect()
        if self.cuda:
            self.torch.cuda.synchronize()
            self.torch.cuda.empty_cache()
            self.torch.cuda.reset_peak_memory_stats()

    def events(self):
        """A (start, end) pair of CUDA events, or None on the CPU."""
        if not self.cuda:
            return None
        return self.torch.cuda.Event(enable_timing=True), self.torch.cuda.Event(enable_timing=True)

    def gpt_model(self, preset=None):
        tk = self.tk
        return tk.GPT(tk.GPTConfig.preset(preset or self.gpt)).to(self.dev).train()

    def tokens(self, mb, seq, vocab=256):
        g = self.torch.Generator().manual_seed(0)
        x = self.torch.randint(0, vocab, (mb, seq + 1), generator=g).to(self.dev)
        return x[:, :-1].contiguous(), x[:, 1:].contiguous()

    def nvml(self):
        """(pynvml, handle) of this device, or None."""
        if not self.cuda:
            return None
        try:
            import pynvml

            pynvml.nvmlInit()
            idx = self.torch.cuda.current_device()
            vis = os.environ.get("CUDA_VISIBLE_DEVICES")
            if vis and vis.split(",")[idx].strip().isdigit():
                idx = int(vis.split(",")[idx])
            return pynvml, pynvml.nvmlDeviceGetHandleByIndex(idx)
        except Exception:
            return None


def nv_read(nv, fn):
    """``pynvml.fn(handle)``, or None where NVML has no answer (a VM, an old driver)."""
    if nv is None:
        return None
    try:
        return getattr(nv[0], fn)(nv[1])
    except Exception:
        return None


def autocast(run, dtype="bf16"):
    t = run.torch
    return t.autocast(run.dev, dtype=t.bfloat16 if dtype == "bf16" else t.float16)


def gpt_step(run, model, opt, x, y, dtype="bf16"):
    with autocast(run, dtype):
        loss = model(x, y)[1]
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss


# --- sections --------------------------------------------------------------------------------

def section_device(run, sec):
    t, tk = run.torch, run.tk
    env = dict(torch=t.__version__, python=sys.version.split()[0], tunekit=tk.__version__, device=run.dev)
    if run.cuda:
        env.update(gpu=run.gpu_name, cuda=t.version.cuda, memory_gib=round(t.cuda.get_device_properties(0).total_memory
                                                                            / 2**30, 1))
        nv = run.nvml()
        try:
            env["driver"] = nv[0].nvmlSystemGetDriverVersion() if nv else None
        except Exception as e:
            env["driver"] = f"unknown ({type(e).__name__})"
    sec.report.env.update(env)
    sec.check("notebook packages blocked", [m for m in NOTEBOOK_PACKAGES if m in sys.modules], [], not any(
        m in sys.modules for m in NOTEBOOK_PACKAGES), "tunekit's public API imported without IPython/ipywidgets/plotly")
    sizes = None if run.cuda else [256, 512]
    run.cal = tk.calibrate("bf16", sizes=sizes, force=run.cuda)   # on CUDA: measured now, not a cached figure
    n = 8192 if run.cuda else 512
    a = t.randn(n, n, device=run.dev, dtype=t.bfloat16)
    b = t.randn(n, n, device=run.dev, dtype=t.bfloat16)
    for _ in range(3):
        a @ b
    reps = 10 if run.cuda else 3
    ev = run.events()
    run.sync()
    t0 = time.perf_counter()
    if ev:
        ev[0].record()
    for _ in range(reps):
        a @ b
    if ev:
        ev[1].record()
    run.sync()
    secs = ev[0].elapsed_time(ev[1]) / 1e3 if ev else time.perf_counter() - t0
    direct = 2 * n**3 * reps / secs / 1e12
    del a, b
    run.free()
    if run.cuda:
        sec.check("calibrated bf16 MAMF vs ~790 TFLOPS (H100/H200)", run.cal.tflops, MAMF_EXPECTED,
                  within(run.cal.tflops, MAMF_EXPECTED, 0.10), "within 10%", best_shape=run.cal.best_shape,
                  layout=run.cal.layout, sweep_s=run.cal.seconds, conditions=str(run.cal.conditions))
        sec.check(f"calibrated MAMF vs a timed {n}-cube matmul (CUDA events)", run.cal.tflops, direct,
                  within(run.cal.tflops, direct, 0.05), "within 5%: the best of the sweep is at least the 8192 cube's")
    else:
        sec.skip("calibrated bf16 MAMF vs ~790 TFLOPS (H100/H200)", run.no_cuda, calibrated=run.cal.tflops)
        sec.skip(f"calibrated MAMF vs a timed {n}-cube matmul", "CPU timings on a shared machine are not judged",
                 calibrated=run.cal.tflops, direct=direct)


def section_profile(run, sec):
    t, tk = run.torch, run.tk
    model = run.gpt_model()
    opt = t.optim.AdamW(model.parameters(), lr=1e-4)
    x, y = run.tokens(run.gpt_mb, run.gpt_seq)
    steps = 5 if run.cuda else 1
    for _ in range(2 if run.cuda else 1):
        gpt_step(run, model, opt, x, y)
    peak = run.peak
    nv = run.nvml()
    recs = []
    for _ in range(3):   # the first counts FLOPs (no TFLOPS); the next two reuse the count
        run.sync()
        a0 = t.cuda.memory_allocated() if run.cuda else None
        e0 = nv_read(nv, "nvmlDeviceGetTotalEnergyConsumption")   # mJ since the driver loaded
        ev = run.events()
        with tk.profile(name="gpu_check gpt2 bf16", dtype="bf16", peak=peak, inputs=(model, opt, x, y)) as rec:
            if ev:
                ev[0].record()
            for _ in range(steps):
                gpt_step(run, model, opt, x, y)
            if ev:
                ev[1].record()
        run.sync()
        got = dict(rec=rec, a0=a0)
        if run.cuda:
            got.update(a1=t.cuda.memory_allocated(), peak=t.cuda.max_memory_allocated(),
                       reserved=t.cuda.memory_reserved(), event_s=ev[0].elapsed_time(ev[1]) / 1e3)
        e1, mem = nv_read(nv, "nvmlDeviceGetTotalEnergyConsumption"), nv_read(nv, "nvmlDeviceGetMemoryInfo")
        limit = nv_read(nv, "nvmlDeviceGetEnforcedPowerLimit")   # mW
        got.update(energy_j=(e1 - e0) / 1e3 if e0 is not None and e1 is not None else None,
                   nvml_used=mem.used if mem is not None else None,
                   power_limit_w=limit / 1e3 if limit is not None else None)
        recs.append(got)
    sources = [g["rec"].flops_source for g in recs]
    sec.check("FLOPs counted once, then reused", sources, ["counted", "cached", "cached"],
              sources == ["counted", "cached", "cached"])
    g = recs[-1]
    rec = g["rec"]
    sec.tables.append(dict(title="the profiled block (last of three)", header=("field", "value"),
                           rows=[(k, clean(getattr(rec, k))) for k in (
                               "wall_s", "flops", "model_flops", "tflops", "mfu", "hfu", "peak_tflops",
                               "peak_tflops_source", "gpu_alloc_delta_bytes", "gpu_peak_delta_bytes",
                               "gpu_reserved_bytes", "nvml_used_bytes", "energy_j", "energy_source", "mean_w",
                               "device")] + [("conditions", str(rec.conditions)), ("notes", "; ".join(rec.notes))]))
    sec.check("TFLOPS = executed FLOPs / wall_s", rec.tflops, rec.flops / rec.wall_s / 1e12,
              within(rec.tflops, rec.flops / rec.wall_s / 1e12, 1e-6))
    sec.check("model FLOPs vs executed (no recompute)", rec.model_flops, rec.flops,
              within(rec.model_flops, rec.flops, 0.05), "within 5%", hfu=rec.hfu, mfu=rec.mfu)
    mfu = rec.model_flops / rec.wall_s / 1e12 / peak if peak else None
    spec = tk.peak_tflops(run.gpu_name or "NVIDIA H100 80GB HBM3", "bf16")   # the spec sheet's dense bf16 peak
    sec.check("MFU against the calibrated MAMF", rec.mfu, mfu, within(rec.mfu, mfu, 1e-6) and 0 < rec.mfu <= 1,
              "MFU = model FLOPs / wall / MAMF, in (0, 1]", peak_tflops=rec.peak_tflops,
              peak_source=rec.peak_tflops_source, spec_peak_tflops=spec,
              mfu_vs_spec=rec.model_flops / rec.wall_s / 1e12 / spec if spec and run.cuda else None)
    if not run.cuda:
        for name in ("wall_s vs CUDA events", "allocated delta = torch.cuda", "peak delta = torch.cuda",
                     "reserved = torch.cuda", "NVML used = a direct NVML read", "NVML energy = a direct NVML read"):
            sec.skip(name, run.no_cuda)
        sec.check("GPU figures are NaN (never 0) without CUDA", str(rec.gpu_peak_delta_bytes), "nan",
                  rec.gpu_peak_delta_bytes != rec.gpu_peak_delta_bytes)
        return
    sec.check("wall_s vs CUDA events", rec.wall_s, g["event_s"], within(rec.wall_s, g["event_s"], 0.03),
              "within 3%: the probe's start/stop sits outside the events", steps=steps)
    sec.check("allocated delta = torch.cuda", rec.gpu_alloc_delta_bytes, g["a1"] - g["a0"],
              rec.gpu_alloc_delta_bytes == g["a1"] - g["a0"], "exact")
    sec.check("peak delta = torch.cuda", rec.gpu_peak_delta_bytes, g["peak"] - g["a0"],
              rec.gpu_peak_delta_bytes == g["peak"] - g["a0"], "exact (the probe resets the peak at its start)")
    sec.check("reserved = torch.cuda", rec.gpu_reserved_bytes, g["reserved"],
              rec.gpu_reserved_bytes == g["reserved"], "exact")
    if g["nvml_used"] is None:
        sec.skip("NVML used = a direct NVML read", "pynvml did not answer (nvmlDeviceGetMemoryInfo)",
                 recorded=rec.nvml_used_bytes)
    else:
        _nvml_memory(sec, rec, g)
    if g["energy_j"] is None or g["power_limit_w"] is None:
        sec.skip("NVML energy = a direct NVML read", "pynvml did not answer (energy counter or power limit)",
                 recorded=rec.energy_j, source=rec.energy_source)
        return
    if rec.energy_source == "nvml+rapl":   # the CPU packages' too: at least the GPU's
        sec.check("NVML (+RAPL) energy >= a direct NVML read", rec.energy_j, g["energy_j"],
                  rec.energy_j >= 0.85 * g["energy_j"], "the record adds the CPU packages (RAPL); NVML's "
                  "counter ticks every ~10-100 ms", source=rec.energy_source)
    else:
        sec.check("NVML energy = a direct NVML read", rec.energy_j, g["energy_j"],
                  within(rec.energy_j, g["energy_j"], 0.15), "within 15%: NVML's counter ticks every ~10-100 ms",
                  source=rec.energy_source)
    sec.check("mean_w = energy_j / wall_s", rec.mean_w, rec.energy_j / rec.wall_s,
              within(rec.mean_w, rec.energy_j / rec.wall_s, 1e-6))
    gpu_w = g["energy_j"] / rec.wall_s   # the direct read spans the block and the probe around it
    sec.check("GPU mean power (direct NVML) within the power limit", gpu_w, g["power_limit_w"],
              50 < gpu_w <= 1.05 * g["power_limit_w"], "50 W < mean <= 1.05 x the enforced limit")


def _nvml_memory(sec, rec, g):
    sec.check("NVML used = a direct NVML read", rec.nvml_used_bytes, g["nvml_used"],
              abs(rec.nvml_used_bytes - g["nvml_used"]) <= 64 * 2**20, "within 64 MiB",
              reserved=g["reserved"], context_and_others=g["nvml_used"] - g["reserved"])
    sec.check("NVML used >= torch reserved", g["nvml_used"], g["reserved"], g["nvml_used"] >= g["reserved"],
              "NVML also sees the CUDA context")


def section_monitor(run, sec):
    t, tk = run.torch, run.tk
    model = run.gpt_model()
    opt = t.optim.AdamW(model.parameters(), lr=1e-4)
    mb = 8 if run.cuda else run.gpt_mb
    x, y = run.tokens(mb, run.gpt_seq)
    n = 24 if run.cuda else 6

    def plain(k):
        run.sync()
        t0 = time.perf_counter()
        for _ in range(k):
            gpt_step(run, model, opt, x, y)
        run.sync()
        return (time.perf_counter() - t0) / k

    def monitored(k, events):
        mon = tk.Monitor(model, name="gpu_check monitor", warmup=2, live=False, dtype="bf16", peak=run.peak)
        times = []
        for i in range(k):
            ev = run.events()
            with mon.step():
                if ev:
                    ev[0].record()
                gpt_step(run, model, opt, x, y)
                if ev:
                    ev[1].record()
            if i >= 3:
                times.append(mon.rows[-1]["wall_s"])
            events.append(ev)
        mon.close()
        return mon, sorted(times)[len(times) // 2]

    plain(3 if run.cuda else 1)
    evs1, evs2 = [], []
    p1 = plain(n // 2)
    mon, m1 = monitored(n, evs1)
    p2 = plain(n // 2)
    _, m2 = monitored(n, evs2)
    df = mon.results(all=True)
    rows = df[~df.warmup.astype(bool) & ~df.counted.astype(bool)]
    sec.check("steps recorded (warm-up and counted steps marked)", len(df), n, len(df) == n,
              measured_steps=len(rows))
    overhead = min(m1, m2) / min(p1, p2) - 1
    own = float((rows.monitor_s / rows.step_s).median())
    if not run.cuda:
        sec.skip("step_s vs CUDA events", run.no_cuda)
        sec.skip("overhead vs the plain loop", "CPU timings on a shared machine are not judged",
                 overhead=overhead, monitor_s_share=own)
        sec.check("monitor_s recorded per step", own, "finite", own == own)
        return
    worst, worst_step = 0.0, None
    for _, r in rows.iterrows():
        ev = evs1[int(r.step)]
        dev_s = ev[0].elapsed_time(ev[1]) / 1e3
        d = abs(r.step_s / dev_s - 1)
        if d > worst:
            worst, worst_step = d, (int(r.step), r.step_s, dev_s)
    sec.check("step_s vs CUDA events, worst step", worst, "<= 0.02", worst <= 0.02,
              "per step: |step_s / event time - 1|", worst_step=worst_step, steps=len(rows))
    sec.check("overhead vs the plain loop (median step)", overhead, "< 0.01", overhead < 0.01,
              plain_s=min(p1, p2), monitored_s=min(m1, m2))
    sec.check("the Monitor's own time per step (monitor_s / step_s)", own, "< 0.01", own < 0.01)
    sec.check("TFLOPS and MFU filled", float(rows.mfu.median()), "(0, 1]", 0 < rows.mfu.median() <= 1,
              tflops=float(rows.tflops.median()))


GPU_LOAD = """
import sys, time, torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
a @ a; torch.cuda.synchronize(); print("ready", flush=True)
t0 = time.time()
while time.time() - t0 < float(sys.argv[1]):
    for _ in range(20): a @ a
    torch.cuda.synchronize()
"""
CPU_LOAD = """
import sys, time
print("ready", flush=True)
t0 = time.time()
while time.time() - t0 < float(sys.argv[1]): pass
"""


def section_conditions(run, sec):
    t, tk = run.torch, run.tk
    n = 4096 if run.cuda else 256
    a = t.randn(n, n, device=run.dev, dtype=t.bfloat16 if run.cuda else t.float32)

    def block(name):
        with tk.profile(name=name, flops="never") as rec:
            t_end = time.perf_counter() + (2.0 if run.cuda else 0.6)
            while time.perf_counter() < t_end:
                for _ in range(10):
                    a @ a
                run.sync()
        return rec.conditions

    quiet = block("gpu_check quiet")
    figures = dict(reason=quiet.reason, other_processes=quiet.gpu_other_processes, throttle=quiet.gpu_throttle)
    if run.cuda:
        sec.check("quiet: verdict", quiet.verdict, "quiet", quiet.verdict == "quiet", **figures)
        sec.check("quiet: NVML other processes", quiet.gpu_other_processes, 0, quiet.gpu_other_processes == 0)
        sec.check("quiet: NVML throttle reasons read", quiet.gpu_throttle, "a reading (not None)",
                  quiet.gpu_throttle is not None)
    else:
        sec.skip("quiet: verdict", "this CPU is shared with other work: quiet is judged on the GPU run", **figures)
    child = subprocess.Popen([sys.executable, "-c", GPU_LOAD if run.cuda else CPU_LOAD, "30"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = child.stdout.readline().strip()
        if line != "ready":
            child.kill()
            child.wait()
            sec.check("busy: the second process started", line, "ready", False, child.stderr.read()[-300:])
            return
        busy = block("gpu_check busy")
    finally:
        child.kill()
        child.wait()
    figures = dict(reason=busy.reason, other_processes=busy.gpu_other_processes, throttle=busy.gpu_throttle)
    sec.check("busy beside a second process: verdict", busy.verdict, "busy", busy.verdict == "busy", **figures)
    if run.cuda:
        sec.check("busy: NVML other processes", busy.gpu_other_processes, ">= 1",
                  (busy.gpu_other_processes or 0) >= 1, "the loader's CUDA context (PID namespaces can hide it)")
    else:
        sec.skip("busy: NVML other processes", run.no_cuda)


def section_fsdp(run, sec):
    tk = run.tk
    mb = 8 if run.cuda else 4
    lab = tk.Lab(config=tk.GPTConfig.preset(run.gpt), device=run.dev, micro_batch=mb,
                 seq_len=run.gpt_seq, precision="bf16", peak_tflops=run.peak)
    steps, warmup = (4, 2) if run.cuda else (1, 1)
    t0 = time.perf_counter()   # the ranks start from the Lab's weights and leave them as they were
    r = lab.run(steps=steps, warmup=warmup, verbose=False, parallel="fsdp", nproc=1)
    secs = time.perf_counter() - t0
    one = lab.run(steps=steps, warmup=warmup, verbose=False)
    backend = "NCCL" if run.cuda else "gloo"   # parallel/worker.py: nccl where the rank has CUDA
    sec.check(f"fsdp over 1 rank ({backend}) ran", r.status, "ok", r.status == "ok" and r.loss == r.loss,
              r.error or "", device=r.device, seconds_with_launch=secs, losses=getattr(r, "losses", None),
              notes="; ".join(map(str, r.notes[:2])))
    sec.check("the rank's device", r.device, run.dev, str(r.device).startswith(run.dev))
    sec.check("first loss vs the one-process run's", r.loss_first, one.loss_first,
              within(r.loss_first, one.loss_first, 0.05), "within 5%: the same weights; the rank draws its own "
              "batches (tests/parallel/test_dist.py checks the losses exactly on the CPU)")
    sec.tables.append(dict(title="one process vs fsdp x 1", header=("run", "step_s", "tokens_per_s", "peak_mem_bytes",
                                                                    "loss_first", "loss"),
                           rows=[(x, y.step_s, y.tokens_per_s, y.peak_mem_bytes, y.loss_first, y.loss)
                                 for x, y in (("one process", one), ("fsdp, 1 rank", r))]))


def _llama(run, big: bool):
    from transformers import LlamaConfig

    if not run.cuda:   # the same family, tiny
        return LlamaConfig(hidden_size=64, intermediate_size=176, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2, vocab_size=512, max_position_embeddings=256)
    if big:   # Llama-3 8B
        return LlamaConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                           num_key_value_heads=8, vocab_size=128256, max_position_embeddings=8192,
                           rope_theta=500000.0, tie_word_embeddings=False)
    return LlamaConfig(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                       num_key_value_heads=8, vocab_size=128256, max_position_embeddings=8192,
                       rope_theta=500000.0, tie_word_embeddings=True)   # Llama-3.2-1B's shape


def _plan_cases(run):
    tk = run.tk
    seq8 = 8192 if run.cuda else 256
    return [
        ("GPT-2 124M, bf16 autocast, 16 x 1024, adamw", tk.GPTConfig.preset(run.gpt),
         dict(precision="bf16", micro_batch=run.gpt_mb, seq_len=run.gpt_seq, optimizer="adamw")),
        ("Llama ~1B, bf16 autocast, 4 x 2048, adamw_fused", _llama(run, False),
         dict(precision="bf16", micro_batch=4 if run.cuda else 2, seq_len=2048 if run.cuda else 128,
              optimizer="adamw_fused")),
        ("Llama-3 8B, pure bf16, checkpointing, 1 x 8192, adamw_fused", _llama(run, True),
         dict(precision="bf16", weights="bf16", micro_batch=1, seq_len=seq8, checkpointing=True,
              optimizer="adamw_fused")),
    ]


def _real_step(run, cfg, kw):
    """The user's plain loop for the planned step: 2 steps, then the third measured."""
    t = run.torch
    hf = not isinstance(cfg, run.tk.GPTConfig)
    dtype = t.bfloat16 if kw.get("weights") == "bf16" else t.float32
    before = t.get_default_dtype()
    t.set_default_dtype(dtype)   # built in its dtype on the device (8B: no fp32 copy first), any transformers
    try:
        with t.device(run.dev), warnings.catch_warnings():
            warnings.simplefilter("ignore")   # transformers' renamings (gradient_checkpointing_enable in 5.x)
            if hf:
                from transformers import AutoModelForCausalLM

                model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa")
                if kw.get("checkpointing"):
                    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            else:
                model = run.tk.GPT(cfg)
    finally:
        t.set_default_dtype(before)
    model.train()
    opt = t.optim.AdamW(model.parameters(), lr=1e-5, fused=kw["optimizer"] == "adamw_fused")
    x, y = run.tokens(kw["micro_batch"], kw["seq_len"], vocab=cfg.vocab_size)
    amp = kw.get("weights") != "bf16"
    ev = run.events()
    for i in range(3):
        if i == 2:
            run.sync()
            if run.cuda:
                t.cuda.reset_peak_memory_stats()
                ev[0].record()
            t0 = time.perf_counter()
        with autocast(run) if amp else t.autocast(run.dev, enabled=False):
            loss = model(input_ids=x, labels=x, use_cache=False).loss if hf else model(x, y)[1]
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    if ev:
        ev[1].record()
    run.sync()
    out = dict(loss=loss.item(), step_s=ev[0].elapsed_time(ev[1]) / 1e3 if ev else time.perf_counter() - t0)
    if run.cuda:
        out.update(max_allocated=t.cuda.max_memory_allocated(), max_reserved=t.cuda.max_memory_reserved())
    del model, opt, loss
    run.free()
    return out


def section_plan(run, sec):
    t, tk = run.torch, run.tk
    device = run.gpu_name if run.cuda else "H100 SXM"
    for name, cfg, kw in _plan_cases(run):
        sec.doing = f"plan: {name}"
        t0 = time.perf_counter()
        p = tk.plan(cfg, device, **kw)
        plan_s = time.perf_counter() - t0
        workspace = p.fixed.get("cublas_workspace", (0.0, ""))[0]
        planned = p.peak_bytes + workspace   # what torch's allocator holds at the peak (no CUDA context)
        head = dict(plan_s=plan_s, planned_total=p.total_bytes, fits=p.fits, peak_at=p.peak_at)
        if run.cuda and not p.fits:
            sec.skip(f"{name}: planned peak vs max_memory_allocated", f"the plan says it does not fit "
                     f"{p.device} ({p.total_bytes / 2**30:.1f} GiB): not run", **head)
            continue
        sec.doing = f"plan: {name}: the real step"
        oom = None
        try:
            real = _real_step(run, cfg, kw)
        except t.cuda.OutOfMemoryError as e:
            oom = str(e)[:200]
        if oom is not None:   # freed once the traceback (and the model its frames hold) is gone
            run.free()
            sec.check(f"{name}: the real step", "CUDA OOM", "fits (the plan said so)", False, oom, **head)
            continue
        sec.check(f"{name}: planned, then stepped for real", real["loss"], "a finite loss",
                  p.total_bytes > 0 and math.isfinite(real["loss"]), planned_peak=p.peak_bytes, **head)
        if not run.cuda:
            sec.skip(f"{name}: planned peak vs max_memory_allocated", run.no_cuda, planned=planned)
        else:
            mx, rs = real["max_allocated"], real["max_reserved"]
            way = "over" if planned > mx else "under"
            sec.check(f"{name}: planned peak (+ cuBLAS workspace) vs max_memory_allocated", planned, mx,
                      within(planned, mx, 0.05), f"within 5%; the plan is {way} by {abs(planned / mx - 1):.1%}",
                      **head)
            sec.check(f"{name}: planned peak vs max_memory_reserved", planned, rs, within(planned, rs, 0.05),
                      "within 5%; reserved >= allocated: the caching allocator's 2 MiB/20 MiB segments and "
                      "fragmentation", reserved_over_allocated=rs / mx)
        sec.check(f"{name}: measured step >= the plan's bound", real["step_s"], f">= {p.bound_step_s:.4g} s",
                  None if not run.cuda else real["step_s"] >= p.bound_step_s,
                  "" if run.cuda else "CPU step against a GPU's bound: not judged",
                  bound_over_measured=ratio(p.bound_step_s, real["step_s"]), bound_mfu=p.bound_mfu)
        expected = getattr(p, "expected", None)
        if expected is None:
            sec.skip(f"{name}: plan.expected step vs measured", "Plan.expected does not exist in this tunekit yet")
        else:
            step_s = getattr(expected, "step_s", None)
            sec.check(f"{name}: plan.expected step vs measured", real["step_s"], step_s,
                      within(real["step_s"], step_s, 0.25) if run.cuda else None,
                      "within 25%" if run.cuda else "CPU step against a GPU's expectation: not judged",
                      expected_mfu=getattr(expected, "mfu", None))


def _lab_runs(run):
    """(label, toggles, the SDPA backend to force or None) of the ladder."""
    from torch.nn.attention import SDPBackend

    runs = [("fp32", dict(precision="fp32"), None), ("tf32", dict(precision="tf32"), None),
            ("bf16", dict(precision="bf16"), None), ("fp16 + GradScaler", dict(precision="fp16"), None),
            ("bf16 + checkpointing", dict(precision="bf16", checkpointing=True), None),
            ("bf16 + fused AdamW", dict(precision="bf16", optimizer="adamw_fused"), None),
            ("bf16 + attention=math", dict(precision="bf16", attention="math"), None),
            ("bf16 + SDPA flash", dict(precision="bf16", attention="sdpa"), SDPBackend.FLASH_ATTENTION),
            ("bf16 + SDPA memory-efficient", dict(precision="bf16", attention="sdpa"), SDPBackend.EFFICIENT_ATTENTION),
            ("bf16 + SDPA math", dict(precision="bf16", attention="sdpa"), SDPBackend.MATH),
            ("bf16 + attention=flash (flash-attn)", dict(precision="bf16", attention="flash"), None),
            ("bf16 + torch.compile", dict(precision="bf16", compile=True), None)]
    return runs


def _lab_run(run, sec, lab, label, toggles, backend, done):
    """One rung of the ladder: a check, its figures, the result kept in ``done``."""
    import contextlib

    from torch.nn.attention import sdpa_kernel

    sec.doing = f"lab: {label}"
    if toggles.get("compile") and not run.cuda:
        sec.skip(f"lab: {label}", "torch.compile on the CPU builds C++ for minutes: CUDA only")
        return
    ctx = sdpa_kernel(backend) if backend is not None else contextlib.nullcontext()
    try:
        with ctx:
            r = lab.run(steps=run.steps, warmup=(3 if toggles.get("compile") else 2) if run.cuda else 1,
                        verbose=False, **toggles)
    except run.tk.lab.ToggleError as e:
        sec.skip(f"lab: {label}", "refused: " + str(e)[:200])
        return
    except Exception as e:   # on CUDA a finding; on the CPU a kernel it lacks (a bug is no RuntimeError)
        run.free()
        if run.cuda or not isinstance(e, RuntimeError):
            sec.check(f"lab: {label}", type(e).__name__, "ok", False, str(e)[:200])
        else:
            sec.skip(f"lab: {label}", "not on the CPU: " + str(e)[:160])
        return
    done[label] = r
    sec.check(f"lab: {label}", r.status, "ok", r.status == "ok" and r.loss == r.loss, r.error or "",
              step_s=r.step_s, tokens_per_s=r.tokens_per_s, mfu=r.mfu, peak_mem_bytes=r.peak_mem_bytes,
              attention_ran=r.attention_ran)


def section_lab(run, sec):
    tk = run.tk
    lab = tk.Lab(config=tk.GPTConfig.preset(run.gpt), device=run.dev, micro_batch=8 if run.cuda else 2,
                 seq_len=run.gpt_seq, peak_tflops=run.peak)
    done = {}
    ladder = _lab_runs(run)
    for label, toggles, backend in ladder[:-1]:
        _lab_run(run, sec, lab, label, toggles, backend, done)
    sec.doing = "find_max_batch_size"
    _max_batch(run, sec, lab)
    _lab_run(run, sec, lab, *ladder[-1], done)   # torch.compile last: the slowest to start
    sec.doing = ""
    sec.tables.append(dict(title="the ladder: one lab.run each (the rows lab.results() lists)", header=(
        "run", "precision", "ckpt", "optimizer", "attention ran", "compile", "step_s", "tokens/s", "MFU", "HFU",
        "peak GiB", "loss"), rows=[(k, r.precision, r.checkpointing, r.optimizer, r.attention_ran, r.compile,
                                    r.step_s, r.tokens_per_s, r.mfu, r.hfu,
                                    (r.peak_mem_bytes or math.nan) / 2**30, r.loss) for k, r in done.items()]))
    expect = [("bf16 faster than fp32", "bf16", "fp32", "tokens_per_s", 1.0),
              ("checkpointing lowers the peak", "bf16", "bf16 + checkpointing", "peak_mem_bytes", 1.0),
              ("fused AdamW at least as fast", "bf16 + fused AdamW", "bf16", "tokens_per_s", 0.98),
              ("SDPA flash faster than SDPA math", "bf16 + SDPA flash", "bf16 + SDPA math", "tokens_per_s", 1.0),
              ("torch.compile faster than eager", "bf16 + torch.compile", "bf16", "tokens_per_s", 1.0)]
    for name, a, b, field, factor in expect:
        if a not in done or b not in done:
            sec.skip(name, "a run it compares did not run")
            continue
        va, vb = getattr(done[a], field), getattr(done[b], field)
        sec.check(name, ratio(va, vb), f"> {factor:g}", (va > factor * vb) if run.cuda else None,
                  f"{field}: {a} / {b}" + ("" if run.cuda else "; CPU figures on a shared machine are not judged"))
    if "bf16 + checkpointing" in done:
        r = done["bf16 + checkpointing"]
        sec.check("checkpointing: HFU > MFU (recompute counted)", ratio(r.hfu, r.mfu), "> 1", r.hfu > r.mfu)


def _max_batch(run, sec, lab):
    t = run.torch
    run.free()
    a0 = t.cuda.memory_allocated() if run.cuda else None
    ooms0 = t.cuda.memory_stats().get("num_ooms", 0) if run.cuda else 0
    toggles = dict(precision="bf16", checkpointing=False, attention="sdpa", optimizer="adamw", verbose=False,
                   memory_budget_bytes=None if run.cuda else 16 * 2**20)
    found = lab.find_max_batch_size(limit=512 if run.cuda else 16, budget_s=45 if run.cuda else 3, **toggles)
    trials = list(found.trials)
    kinds = [getattr(tr.reason, "kind", str(tr.reason)) for tr in trials]
    if "trial.oom" not in kinds and found.too_big is not None:   # (the CPU's dry run takes this path too)
        # the search's extrapolation skipped every trial past the memory: one trial at the smallest
        # size that did not fit, with no earlier trial to extrapolate from (the analytic estimate decides)
        again = lab.find_max_batch_size(start=found.too_big, limit=found.too_big, budget_s=20, **toggles)
        trials += again.trials
        kinds += [getattr(tr.reason, "kind", str(tr.reason)) for tr in again.trials]
    sec.tables.append(dict(title="find_max_batch_size trials", header=("micro_batch", "fits", "used_bytes",
                                                                       "reason", "seconds"),
                           rows=[(tr.micro_batch, tr.fits, tr.used_bytes, str(tr.reason), tr.seconds)
                                 for tr in trials]))
    sec.check("find_max_batch_size", found.best, "a micro-batch", found.best is not None, found.verdict,
              stopped=found.stopped, trials=len(found.trials))
    if not run.cuda:
        sec.skip("a trial reached a real CUDA OOM", run.no_cuda, reasons=kinds)
        sec.check("memory back to its baseline (RSS)", found.after_bytes, found.baseline_bytes, None,
                  "RSS on a shared CPU is not judged")
        return
    run.free()
    a1, ooms1 = t.cuda.memory_allocated(), t.cuda.memory_stats().get("num_ooms", 0)
    sec.check("a trial reached a real CUDA OOM", kinds.count("trial.oom"), ">= 1", "trial.oom" in kinds,
              num_ooms_before=ooms0, num_ooms_after=ooms1, reasons=kinds)
    sec.check("torch.cuda num_ooms rose", ooms1 - ooms0, ">= 1", ooms1 > ooms0)
    sec.check("memory allocated as it was before the search", a1, a0, abs(a1 - a0) <= 2 * 2**20, "within 2 MiB",
              after_bytes=found.after_bytes, baseline_bytes=found.baseline_bytes)


def section_expect(run, sec):
    """lab.expect judged on the device: a traced base run calibrates, then each rung is expected
    before it is measured (issue 42's ladder, a few rungs of it within the lease)."""
    if not run.cuda:
        sec.skip("lab.expect on the device", "the CPU's expectation is judged by benchmarks/bench_expect.py "
                                              "(its calibration takes longer than a dry run)")
        return
    tk = run.tk
    lab = tk.Lab(config=tk.GPTConfig.preset(run.gpt), device=run.dev, micro_batch=8, seq_len=run.gpt_seq,
                 peak_tflops=run.peak, precision="bf16", attention="sdpa")
    lab.run(steps=2, warmup=1, verbose=False)
    base = lab.run(steps=5, warmup=1, trace=True, verbose=False)
    rows = []
    for label, change in (("checkpointing on", dict(checkpointing=True)), ("micro-batch x2", dict(micro_batch=16)),
                          ("SGD", dict(optimizer="sgd")), ("SDPA math", dict(attention="math"))):
        sec.doing = label
        e = lab.expect(base=base, **change)          # made before the run it predicts
        r = lab.run(steps=5, warmup=1, verbose=False, **change)
        err = e.step_s / r.step_s - 1
        peak_err = e.peak_bytes / r.peak_mem_bytes - 1 if r.peak_mem_bytes else math.nan
        rows.append((label, e.step_s * 1e3, r.step_s * 1e3, err, e.peak_bytes / 2**30,
                     (r.peak_mem_bytes or math.nan) / 2**30, peak_err, e.calibration))
        sec.check(f"expected step of {label} within 20%", err, "|error| <= 0.20", abs(err) <= 0.20,
                  f"expected {e.step_s * 1e3:.1f} ms, measured {r.step_s * 1e3:.1f} ms")
        sec.check(f"expected peak of {label} within 5%", peak_err, "|error| <= 0.05", abs(peak_err) <= 0.05)
    sec.doing = ""
    sec.tables.append(dict(title="lab.expect, then the run (base: a traced bf16 run of the same Lab)", header=(
        "change", "expected ms", "measured ms", "step error", "expected GiB", "measured GiB", "peak error",
        "calibrated by"), rows=rows))


FUNCS = dict(device=section_device, profile=section_profile, monitor=section_monitor, conditions=section_conditions,
             fsdp=section_fsdp, plan=section_plan, lab=section_lab, expect=section_expect)


# --- the runner -------------------------------------------------------------------------------

def _alarm(signum, frame):
    raise SectionTimeout()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dry-run", action="store_true", help="CPU only, small shapes: every step that can run here")
    ap.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "build" / "gpu_check"),
                    help="folder for gpu_check.json and gpu_check.md (default $OUT, else build/gpu_check)")
    ap.add_argument("--budget-s", type=float, default=BUDGET_S, help=f"the whole run's seconds (default {BUDGET_S:g})")
    ap.add_argument("--only", default=",".join(SECTIONS), help=f"sections to run, comma-separated: {SECTIONS}")
    args = ap.parse_args(argv)
    only = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = sorted(set(only) - set(SECTIONS))
    if unknown:
        ap.error(f"unknown sections {unknown}; choose from {SECTIONS}")
    if args.budget_s <= 0:
        ap.error(f"--budget-s must be positive, got {args.budget_s:g}")
    blocker = _NoNotebook()
    sys.meta_path.insert(0, blocker)
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    handler = signal.signal(signal.SIGALRM, _alarm)
    run = None
    try:
        t_start = time.perf_counter()
        run = Run(args)
        return _sections(run, args, only, t_start)
    finally:   # as it was: main() also runs inside a test's process
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, handler)
        sys.meta_path.remove(blocker)
        if run is not None:
            run.torch.set_num_threads(run.threads_before)


def _sections(run, args, only, t_start) -> int:
    deadline = t_start + args.budget_s
    report = Report(Path(args.out), "cuda" if run.cuda else "dry run (CPU)")
    if not run.cuda and not args.dry_run:
        print("gpu_check: no CUDA device: running the CPU dry run instead", flush=True)
    # A hang in C code (NCCL, a driver call) never reaches Python's signal handler: a watchdog writes
    # what was found and ends the process a little after the deadline.
    current = {}

    def watchdog():
        sec = current.get("section")
        if sec is not None:
            sec.status, sec.reason = "skipped", "hung past the run's deadline (watchdog)"
        report.write()
        print("gpu_check: watchdog: past the deadline, report written", flush=True)
        os._exit(3)

    dog = threading.Timer(args.budget_s + WATCHDOG_S, watchdog)
    dog.daemon = True
    dog.start()
    try:
        for name in SECTIONS:
            sec = Section(name)
            sec.report = report
            report.sections.append(sec)
            sec.limit_s = LIMITS_S[name]
            if name not in only:
                sec.status, sec.reason = "skipped", "not asked for (--only)"
                continue
            left = deadline - time.perf_counter()
            if left < min(10.0, LIMITS_S[name]):
                sec.status = "skipped"
                sec.reason = f"not started: {max(left, 0):.0f} s left of the run's {args.budget_s:g} s budget"
                report.write()
                continue
            current["section"] = sec
            _section(run, sec, min(LIMITS_S[name], left))
            current.pop("section", None)
            report.write()
    finally:
        dog.cancel()
    report.env["total_s"] = round(time.perf_counter() - t_start, 1)
    report.write()
    summary = report.summary()
    print(f"gpu_check: {summary} in {report.env['total_s']} s; {report.out}/gpu_check.md", flush=True)
    return 2 if summary["error"] else 1 if summary["fail"] else 0


def _section(run, sec, limit):
    """Run one section under its time limit: an overrun or an exception is recorded, never raised."""
    print(f"== {sec.name} (limit {limit:.0f} s)", flush=True)
    t0 = time.perf_counter()
    try:
        signal.setitimer(signal.ITIMER_REAL, limit)
        FUNCS[sec.name](run, sec)
        signal.setitimer(signal.ITIMER_REAL, 0)
    except SectionTimeout:
        counts = {r: sum(c["result"] == r for c in sec.checks) for r in ("pass", "fail", "skipped")}
        sec.status = "skipped"
        sec.reason = (f"overran its {limit:.0f} s limit" + (f" in {sec.doing!r}" if sec.doing else "")
                      + f"; the checks done before: {counts}")
    except Exception as e:   # a finding on CUDA, a bug in the script on the CPU
        signal.setitimer(signal.ITIMER_REAL, 0)
        sec.status, sec.reason = "error", f"{type(e).__name__}: {str(e)[:300]}"
        sec.tables.append(dict(title="traceback", header=("line",),
                               rows=[(x,) for x in traceback.format_exc().splitlines()[-12:]]))
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    sec.seconds = time.perf_counter() - t0
    sec.finish()
    print(f"== {sec.name}: {sec.status} {sec.reason} ({sec.seconds:.1f} s)", flush=True)
    try:
        run.free()
    except Exception as e:   # a broken CUDA context: the next sections will say so
        print(f"gpu_check: freeing memory after {sec.name} failed: {e}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
