"""This CPU's memory a kernel library keeps once per process, measured: what a process's RSS grows by
the first time it runs a dtype's matmul, each new matmul shape, and a dtype's first attention, and
keeps until the process ends. No tensor holds it, so no plan counts it: oneDNN's JIT-compiled code
and its primitive cache (one primitive per shape and layout, up to ONEDNN_PRIMITIVE_CACHE_CAPACITY,
1024 by default) and the library code pages the first call faults in. A bf16 run after an fp32 one
raises the process's floor for good (issue 42: 398 -> 414 MiB on the small Llama); lab.expect adds
these figures for the kernels tunekit's runs in this process have not run yet (lab.expect_peak).
Measurement layer.

Each figure is measured in a FRESH CHILD process (a kernel's first use happens once per process:
this one ran its kernels long ago), on this process's torch thread count: the child first runs one
matmul and one attention in another dtype (fp32's reference is bf16, any other's fp32), as a Lab's
base run leaves a process; then its settled RSS (measure.device_meter.settled_rss_bytes: glibc's
freed pages handed back) around the dtype's first matmul, around ``len(SHAPES)`` matmuls of new
shapes (``shape_bytes``: their growth over their count), and around its first causal SDPA forward
and backward (``attention_bytes``); ``dtype_bytes``: the first matmul's growth less one shape's.
``REPEATS`` children per dtype, the median of each figure. RSS does not follow the CPU's load; the
conditions are kept all the same (``verdict``). Cached as JSON beside the stream's figures
(measure.stream), once per machine, torch version and thread count (the key), then read.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from statistics import median

from tunekit.core import paths
from tunekit.core.registry import BF16, FP32

VERSION = 1
DTYPES = (FP32, BF16)            # what a CPU Lab runs (fp16 is refused on a CPU: core.toggles)
REPEATS = 3                      # children per dtype, each figure their median
FIGURES = ("dtype_bytes", "shape_bytes", "attention_bytes")
FIRST = (384, 160, 288)          # the first matmul (m, k, n) of the measured dtype
# new shapes of a small model's linear layers (tokens x features), none the reference's or FIRST's
SHAPES = ((256, 96, 200), (512, 128, 384), (1024, 64, 256), (768, 256, 512), (2048, 128, 96),
          (320, 512, 1024), (640, 192, 160), (1536, 320, 224))
ATTENTION = (4, 4, 128, 32)      # batch, heads, sequence, head dim of the causal SDPA


def _key(name: str, threads: int) -> str:
    import torch

    return f"{name}|torch {torch.__version__}|{threads} threads|v{VERSION}"


def child(dtype: str, threads: int) -> dict:
    """The figures of ``dtype``, measured in THIS process (run it in a fresh one: `measure_child`)."""
    import torch

    from tunekit.core import registry
    from tunekit.measure.device_meter import settled_rss_bytes

    torch.set_num_threads(threads)
    d = getattr(torch, registry.dtype(dtype).torch_name)
    other = getattr(torch, registry.dtype(BF16 if dtype == FP32 else FP32).torch_name)

    def matmul(shape, dt):
        m, k, n = shape
        a, b = torch.randn(m, k).to(dt), torch.randn(k, n).to(dt)
        (a @ b).sum()

    def attention(dt):
        q = torch.randn(*ATTENTION).to(dt).requires_grad_()
        torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True).sum().backward()

    def grown(work) -> int:
        before = settled_rss_bytes()
        work()
        return settled_rss_bytes() - before

    matmul((192, 80, 144), other)   # the process as a Lab's base run in another dtype leaves it
    attention(other)
    first = grown(lambda: matmul(FIRST, d))
    shape = grown(lambda: [matmul(s, d) for s in SHAPES]) / len(SHAPES)
    return {"dtype_bytes": max(first - shape, 0.0), "shape_bytes": max(shape, 0.0),
            "attention_bytes": float(max(grown(lambda: attention(d)), 0))}


def measure_child(dtypes, threads: int, repeats: int = REPEATS) -> dict:
    """{dtype: [`child`'s figures, ...]}: each of ``dtypes`` in ``repeats`` fresh processes of this
    Python, all run side by side (their RSS does not follow the load), each on ``threads`` torch
    threads; a child that fails is left out."""
    env = {**os.environ, "PYTHONPATH": paths.python_path(), "OMP_NUM_THREADS": str(threads)}
    code = ("import json, sys; from tunekit.measure.first_use import child; "
            "print(json.dumps(child(sys.argv[1], int(sys.argv[2]))))")
    procs = [(d, subprocess.Popen([sys.executable, "-c", code, d, str(threads)], stdout=subprocess.PIPE,
                                  stderr=subprocess.DEVNULL, env=env, text=True))
             for d in dtypes for _ in range(repeats)]
    out: dict = {d: [] for d in dtypes}
    for d, p in procs:
        try:
            text, _ = p.communicate(timeout=120)
            row = json.loads(text.strip().splitlines()[-1]) if p.returncode == 0 and text.strip() else None
        except (subprocess.TimeoutExpired, ValueError):
            p.kill()
            p.communicate()
            row = None
        if isinstance(row, dict) and all(isinstance(row.get(f), (int, float)) for f in FIGURES):
            out[d].append(row)
    return out


def measure_first_use(refresh: bool = False) -> dict:
    """{"figures": {dtype: {"dtype_bytes", "shape_bytes", "attention_bytes"}}, "repeats": {dtype: [...]},
    "verdict", "taken_at"}: from the cache when it holds this machine's, torch's and thread count's,
    else measured once (`measure_child`, a few seconds per dtype) and cached. A dtype no child could
    measure is left out (lab.expect then adds nothing for it). ``refresh=True`` measures again."""
    import torch

    from tunekit.measure.conditions import ConditionsMeter
    from tunekit.measure.peaks import device_name

    threads = torch.get_num_threads()
    key = _key(device_name("cpu"), threads)
    cache = paths.read_cache("first_use.json")
    if key in cache and not refresh and isinstance(cache[key].get("figures"), dict):
        return cache[key]
    meter = ConditionsMeter().start()
    t0 = time.perf_counter()
    rows = measure_child(DTYPES, threads)
    cond = meter.stop(time.perf_counter() - t0)
    entry = {"figures": {d: {f: float(median(r[f] for r in got)) for f in FIGURES} for d, got in rows.items() if got},
             "repeats": rows, "taken_at": time.time(), "verdict": cond.verdict if cond is not None else "unknown"}
    cache[key] = entry
    paths.write_cache("first_use.json", cache)
    return entry
