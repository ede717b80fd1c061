"""Compute microbenchmarks: forward vs backward, naive vs fused softmax, SwiGLU d_ff search,
matmul shape sweep, torch.compile on/off. CPU-sized defaults run in seconds."""
from __future__ import annotations

import time

import torch
import torch.nn as nn

from tunekit.bench.frame import frame
from tunekit.core.advisor import swiglu_dff_candidates
from tunekit.core.registry import BF16, FP32
from tunekit.measure.device import default_device, synchronize, torch_dtype
from tunekit.measure.timing import NaN, stats, time_repeats


def _default_dtype(dev) -> str:
    # tensor-core shapes are what the documents measure; CPUs have no fast bf16 everywhere
    return BF16 if dev.type == "cuda" else FP32


def _mlp_stack(width: int, depth: int) -> nn.Module:
    layers = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.GELU()]
    return nn.Sequential(*layers)


def _time_fwd_bwd(model, make_loss, device, warmup, repeats):
    fwd, bwd = [], []
    for i in range(warmup + repeats):
        synchronize(device)
        t0 = time.perf_counter()
        loss = make_loss(model)
        synchronize(device)
        t1 = time.perf_counter()
        loss.backward()
        synchronize(device)
        t2 = time.perf_counter()
        model.zero_grad(set_to_none=True)
        if i >= warmup:
            fwd.append(t1 - t0)
            bwd.append(t2 - t1)
    return fwd, bwd


def forward_backward_ratio(device=None, width: int = 256, depth: int = 4, tokens: int = 512,
                           gpt_preset: str | None = "cpu-tiny", micro_batch: int = 4,
                           seq_len: int = 64, warmup: int = 2, repeats: int = 5):
    """Time forward and backward of a Linear+GELU stack and of tunekit's GPT.

    Linear layers do 2x the forward FLOPs in backward (grad of input and of weight), so the
    documents expect backward ~2x forward, often more because its shapes are more awkward.

    Example: ``bench.plot(bench.forward_backward_ratio())``.
    """
    dev = default_device(device)
    rows = []
    x = torch.randn(tokens, width, device=dev)
    cases = [(f"linear stack {depth}x{width}", _mlp_stack(width, depth).to(dev),
              lambda m: m(x).square().mean())]
    if gpt_preset:
        from tunekit.models.gpt import GPT, GPTConfig

        gpt = GPT(GPTConfig.preset(gpt_preset)).to(dev)
        idx = torch.randint(0, gpt.config.vocab_size, (micro_batch, seq_len), device=dev)
        cases.append((f"tunekit GPT {gpt_preset}", gpt, lambda m: m(idx, idx)[1]))
    for name, model, make_loss in cases:
        fwd, bwd = _time_fwd_bwd(model, make_loss, dev, warmup, repeats)
        f, b = stats(fwd), stats(bwd)
        rows.append({"case": name, "phase": "forward", **f, "ratio": 1.0})
        rows.append({"case": name, "phase": "backward", **b,
                     "ratio": b["median_s"] / f["median_s"]})
    return frame(rows, "forward_backward", dev)


def naive_softmax(x: torch.Tensor) -> torch.Tensor:
    """Softmax as separate kernels, each a full pass over memory: max, sub, exp, sum, div.

    Example: ``bench.naive_softmax(torch.randn(4, 8))``."""
    m = x.max(dim=-1, keepdim=True).values
    e = (x - m).exp()
    return e / e.sum(dim=-1, keepdim=True)


def softmax_traffic_bytes(n_elements: int, elem_bytes: int, fused: bool) -> int:
    """Bytes moved, ignoring the per-row vectors: fused reads x and writes y (2N); naive reads
    N in max, sum; reads N and writes N in sub, exp, div: 8N."""
    return (2 if fused else 8) * n_elements * elem_bytes


def softmax_naive_vs_fused(rows: int = 2048, cols: int = 1024, dtype=FP32, device=None,
                           warmup: int = 2, repeats: int = 7):
    """Time torch.softmax (one fused kernel) against the five-kernel naive version.

    Example: ``bench.softmax_naive_vs_fused(rows=4096)``."""
    dev = default_device(device)
    x = torch.randn(rows, cols, device=dev, dtype=torch_dtype(dtype))
    assert torch.allclose(naive_softmax(x).float(), torch.softmax(x, -1).float(), atol=1e-2)
    out = []
    for name, fn, fused in (("naive (5 kernels)", lambda: naive_softmax(x), False),
                            ("fused torch.softmax", lambda: torch.softmax(x, dim=-1), True)):
        st = stats(time_repeats(fn, dev, warmup, repeats))
        moved = softmax_traffic_bytes(x.numel(), x.element_size(), fused)
        out.append({"variant": name, **st, "bytes_moved": moved,
                    "gb_per_s": moved / st["median_s"] / 1e9})
    out[0]["speedup_vs_naive"], out[1]["speedup_vs_naive"] = 1.0, out[0]["median_s"] / out[1]["median_s"]
    return frame(out, "softmax", dev, ["gb_per_s uses the modeled traffic (GB = 1e9 bytes)"])


def _mlp_gemms(x, w_gate, w_up, w_down):
    # the three SwiGLU GEMMs; the elementwise silu*up is left out to time the matmuls alone
    g = x @ w_gate
    u = x @ w_up
    return g, u, g @ w_down


def swiglu_dff_search(h: int = 256, tokens: int = 256, span: int = 64, step: int = 8,
                      dtype=None, device=None, warmup: int = 1, repeats: int = 3):
    """Time the SwiGLU MLP GEMMs for d_ff around 8/3*h and rank them by TFLOPS.

    Candidates: int(8/3*h) (the baseline), every `step` in +-`span` around it, and the x64/x128/
    x256 roundings. FLOPs: 3 GEMMs of 2*tokens*h*d_ff. Returns all candidates, fastest first,
    with `is_baseline`; the H100 run of stas00/ml-engineering training/performance/README.md
    (h=4096) found 10944 46% faster than 10922.
    dtype None: bf16 on CUDA (tensor cores, as in that run), fp32 elsewhere.

    Example: ``bench.swiglu_dff_search(h=4096, tokens=4096)`` on a GPU.
    """
    dev = default_device(device)
    dtype = dtype or _default_dtype(dev)
    dt = torch_dtype(dtype)
    c = swiglu_dff_candidates(h)
    base = int(c["8/3*h"])
    start = base - span - (base - span) % step
    cands = sorted({base, c["x64"], c["x128"], c["x256"], *range(max(step, start), base + span + 1, step)})
    x = torch.randn(tokens, h, device=dev, dtype=dt)
    rows = []
    for d_ff in cands:
        wg, wu = (torch.randn(h, d_ff, device=dev, dtype=dt) for _ in range(2))
        wd = torch.randn(d_ff, h, device=dev, dtype=dt)
        st = stats(time_repeats(lambda: _mlp_gemms(x, wg, wu, wd), dev, warmup, repeats))
        flops = 3 * 2 * tokens * h * d_ff
        rows.append({"d_ff": d_ff, "tflops": flops / st["median_s"] / 1e12, **st,
                     "mlp_params": 3 * h * d_ff, "is_baseline": d_ff == base,
                     "multiple_of_64": d_ff % 64 == 0})
    df = frame(rows, "swiglu_dff", dev, [f"h={h}, tokens={tokens}, dtype={dtype}"])
    df = df.sort_values("tflops", ascending=False, ignore_index=True)
    df.attrs["baseline_d_ff"] = base
    return df


def matmul_shape_sweep(dim: str = "n", values=None, m: int = 512, k: int = 512, n: int = 512,
                       dtype=None, device=None, warmup: int = 1, repeats: int = 3):
    """TFLOPS of an (m, k) @ (k, n) matmul while one dimension sweeps `values`: the saw-tooth of
    tile and wave quantization on GPUs (on CPUs, cache and vector-width effects). dtype None:
    bf16 on CUDA, fp32 elsewhere.

    Example: ``bench.matmul_shape_sweep("n", values=range(4032, 4161, 8))``."""
    dev = default_device(device)
    dtype = dtype or _default_dtype(dev)
    dt = torch_dtype(dtype)
    if dim not in ("m", "k", "n"):
        raise ValueError("dim must be 'm', 'k' or 'n'")
    values = list(values) if values is not None else list(range(448, 577, 8))
    rows = []
    for v in values:
        shape = {"m": m, "k": k, "n": n, dim: v}
        a = torch.randn(shape["m"], shape["k"], device=dev, dtype=dt)
        b = torch.randn(shape["k"], shape["n"], device=dev, dtype=dt)
        st = stats(time_repeats(lambda: a @ b, dev, warmup, repeats))
        flops = 2 * shape["m"] * shape["k"] * shape["n"]
        rows.append({dim: v, "m": shape["m"], "k": shape["k"], "n": shape["n"],
                     "tflops": flops / st["median_s"] / 1e12, **st,
                     "pow2_factor": v & -v})
    df = frame(rows, "matmul_sweep", dev, [f"sweeping {dim}, dtype={dtype}"])
    df.attrs["dim"] = dim
    return df


def compile_on_off(device=None, width: int = 128, depth: int = 2, tokens: int = 256,
                   backend: str = "inductor", warmup: int = 2, repeats: int = 5):
    """Forward+backward of a small Linear+GELU stack, eager vs torch.compile(backend=...).

    compile_s is the first compiled call (tracing + codegen; on CPU inductor needs a C++
    compiler); ``times`` holds every timed repeat (what `tunekit.verdict` compares). If
    compiling fails, the compiled row is NaN and `attrs["notes"]` says why.

    Example: ``bench.compile_on_off(backend="inductor")``.
    """
    dev = default_device(device)
    model = _mlp_stack(width, depth).to(dev)
    x = torch.randn(tokens, width, device=dev)
    rows, notes = [], []

    def step(m):
        loss = m(x).square().mean()
        loss.backward()
        m.zero_grad(set_to_none=True)

    eager_times = time_repeats(lambda: step(model), dev, warmup, repeats)
    eager = stats(eager_times)
    rows.append({"variant": "eager", **eager, "compile_s": 0.0, "speedup": 1.0, "times": eager_times})
    torch._dynamo.reset()
    try:
        compiled = torch.compile(model, backend=backend)
        synchronize(dev)
        t0 = time.perf_counter()
        step(compiled)
        synchronize(dev)
        compile_s = time.perf_counter() - t0
        times = time_repeats(lambda: step(compiled), dev, warmup, repeats)
        st = stats(times)
        rows.append({"variant": f"compiled ({backend})", **st, "compile_s": compile_s,
                     "speedup": eager["median_s"] / st["median_s"], "times": times})
    except Exception as e:   # no C++ compiler, unsupported platform, ...
        notes.append(f"torch.compile skipped: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
        rows.append({"variant": f"compiled ({backend})", **stats([]), "compile_s": NaN,
                     "speedup": NaN, "times": []})
    finally:
        torch._dynamo.reset()
    return frame(rows, "compile", dev, notes)
