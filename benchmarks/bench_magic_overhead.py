"""Overhead of `%gpuprofile on` per trivial cell and of FLOP accounting on a re-run, in a real kernel.

Runs one Jupyter kernel and times, side by side in the same run:
  A. N trivial cells bare, then N with `%gpuprofile on` (displayed), N with `-q`, and N under
     ipyexperiments' cell logger for scale;
  B. a small training-step cell re-run bare vs under `%%gpuprofile` after its FLOPs were counted
     (steady state: the count is reused, the fingerprint is checked each run).
Prints per-cell overheads and ratios. Usage: python benchmarks/bench_magic_overhead.py [N]
"""
from __future__ import annotations

import statistics
import sys
import time

from jupyter_client.manager import start_new_kernel

N = int(sys.argv[1]) if len(sys.argv) > 1 else 200


def run(kc, code):
    reply = kc.execute_interactive(code, timeout=120, output_hook=lambda msg: None)
    if reply["content"]["status"] != "ok":
        raise RuntimeError(f"cell failed: {code!r}: {reply['content']}")


def time_cells(kc, cells):
    t0 = time.perf_counter()
    for c in cells:
        run(kc, c)
    return time.perf_counter() - t0


def main():
    km, kc = start_new_kernel(kernel_name="python3")
    try:
        run(kc, "import torch, tunekit\n%load_ext tunekit")
        trivial = [f"a = {i}" for i in range(N)]
        time_cells(kc, trivial[:20])                         # warm the kernel
        bare = time_cells(kc, trivial)
        run(kc, "%gpuprofile on")
        shown = time_cells(kc, trivial)
        run(kc, "%gpuprofile off")
        run(kc, "%gpuprofile on -q")
        quiet = time_cells(kc, trivial)
        run(kc, "%gpuprofile off")
        print(f"A. {N} trivial cells (each a new source, so each is FLOP-counted once)")
        print(f"   bare                 {bare:7.3f} s  ({bare / N * 1e3:6.2f} ms/cell)")
        print(f"   %gpuprofile on       {shown:7.3f} s  overhead {(shown - bare) / N * 1e3:6.2f} ms/cell")
        print(f"   %gpuprofile on -q    {quiet:7.3f} s  overhead {(quiet - bare) / N * 1e3:6.2f} ms/cell")
        # for scale: ipyexperiments' own per-cell logger on the same cells
        run(kc, "from ipyexperiments import IPyExperimentsCPU\nexp = IPyExperimentsCPU()")
        ipx = time_cells(kc, trivial)
        run(kc, "exp.finish(); del exp")
        print(f"   ipyexperiments CellLogger {ipx:7.3f} s  overhead {(ipx - bare) / N * 1e3:6.2f} ms/cell")

        setup = ("torch.manual_seed(0); torch.set_num_threads(2)\n"
                 "model = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.GELU(), torch.nn.Linear(2048, 512))\n"
                 "opt = torch.optim.AdamW(model.parameters())\nx = torch.randn(64, 512)")
        step = "loss = model(x).square().mean(); loss.backward(); opt.step(); opt.zero_grad()"
        run(kc, setup)
        run(kc, f"%%gpuprofile -q -n step\n{step}")            # the counted run
        pairs = []
        for _ in range(15):
            t_bare = time_cells(kc, [step] * 5) / 5
            t_prof = time_cells(kc, [f"%%gpuprofile -q -n step\n{step}"] * 5) / 5
            pairs.append((t_bare, t_prof))
        b = statistics.median(p[0] for p in pairs)
        p = statistics.median(p[1] for p in pairs)
        run(kc, "import json; print(json.dumps(tunekit.history().iloc[-1][['flops_source', 'wall_s', 'tflops']].to_dict()))")
        print("B. training-step cell re-run (FLOPs cached after the first run), median of 15x5 runs")
        print(f"   bare cell            {b * 1e3:7.2f} ms")
        print(f"   %%gpuprofile cell    {p * 1e3:7.2f} ms  overhead {(p - b) / b:+.1%} of the cell's time")
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


if __name__ == "__main__":
    main()
