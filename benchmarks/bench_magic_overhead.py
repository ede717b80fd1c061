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
ROUNDS = 5


KERNEL_SIDE = """
import time, statistics
def _kside(n, rounds):
    ip = get_ipython()
    def t(cells):
        t0 = time.perf_counter()
        for c in cells:
            ip.run_cell(c, store_history=True)
        return (time.perf_counter() - t0) / len(cells) * 1e3
    res = []
    for r in range(rounds):
        cells = [f"k{r} = {i}" for i in range(n)]
        bare = t(cells)
        ip.run_line_magic("gpuprofile", "on")
        shown = t([c + " " for c in cells])
        ip.run_line_magic("gpuprofile", "off")
        ip.run_line_magic("gpuprofile", "on -q")
        quiet = t([c + "  " for c in cells])
        ip.run_line_magic("gpuprofile", "off")
        res.append((bare, shown - bare, quiet - bare))
    m = [statistics.median(x[i] for x in res) for i in range(3)]
    return (f"A2. kernel side (run_cell loop in the kernel): bare {m[0]:.2f} ms/cell, overhead "
            f"{m[1]:.2f} ms/cell displayed, {m[2]:.2f} ms/cell -q (medians of {rounds} rounds)")
"""


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
        time_cells(kc, [f"w = {i}" for i in range(20)])          # warm the kernel
        rounds = []
        for r in range(ROUNDS):  # interleaved, so drifts in machine load hit all variants alike
            cells = [f"a{r} = {i}" for i in range(N)]          # new sources: each is counted once
            bare = time_cells(kc, cells)
            run(kc, "%gpuprofile on")
            shown = time_cells(kc, [c + " " for c in cells])
            run(kc, "%gpuprofile off")
            run(kc, "%gpuprofile on -q")
            quiet = time_cells(kc, [c + "  " for c in cells])
            run(kc, "%gpuprofile off")
            rounds.append((bare / N, (shown - bare) / N, (quiet - bare) / N))
        med = [statistics.median(r[i] for r in rounds) * 1e3 for i in range(3)]
        print(f"A. {N} trivial cells x {ROUNDS} interleaved rounds (each cell a new source, so FLOP-counted once)")
        print(f"   bare cell                      {med[0]:6.2f} ms/cell (median)")
        print(f"   %gpuprofile on (one-line view) overhead {med[1]:6.2f} ms/cell (median; rounds: "
              + ", ".join(f"{r[1] * 1e3:.2f}" for r in rounds) + ")")
        print(f"   %gpuprofile on -q              overhead {med[2]:6.2f} ms/cell (median; rounds: "
              + ", ".join(f"{r[2] * 1e3:.2f}" for r in rounds) + ")")
        # A2: the same inside the kernel process (run_cell in a loop): what the kernel itself pays,
        # without the benchmark client's decoding of each output message
        run(kc, KERNEL_SIDE)
        out = []
        kc.execute_interactive(f"print(_kside({N}, {ROUNDS}))", timeout=300,
                               output_hook=lambda m: out.append(m["content"].get("text", ""))
                               if m["msg_type"] == "stream" else None)
        print("".join(out).rstrip())
        # for scale: ipyexperiments' own per-cell logger on the same kind of cells, one round
        cells = [f"b = {i}" for i in range(N)]
        bare = time_cells(kc, cells)
        run(kc, "from ipyexperiments import IPyExperimentsCPU\nexp = IPyExperimentsCPU()")
        ipx = time_cells(kc, [c + " " for c in cells])
        run(kc, "exp.finish(); del exp")
        print(f"   ipyexperiments CellLogger      overhead {(ipx - bare) / N * 1e3:6.2f} ms/cell")
        print(f"   target < 2 ms/cell: {'PASS' if med[1] < 2 else 'FAIL'} (displayed), "
              f"{'PASS' if med[2] < 2 else 'FAIL'} (-q)")

        setup = ("torch.manual_seed(0); torch.set_num_threads(2)\n"
                 "model = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.GELU(),"
                 " torch.nn.Linear(2048, 512))\n"
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
        run(kc, "import json; print(json.dumps(tunekit.history().iloc[-1]"
                "[['flops_source', 'wall_s', 'tflops']].to_dict()))")
        print("B. training-step cell re-run (FLOPs cached after the first run), median of 15x5 runs")
        print(f"   bare cell            {b * 1e3:7.2f} ms")
        print(f"   %%gpuprofile cell    {p * 1e3:7.2f} ms  overhead {(p - b) / b:+.1%} of the cell's time")
        print(f"   target < 5%: {'PASS' if (p - b) / b < 0.05 else 'FAIL'}")
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


if __name__ == "__main__":
    from tunekit.measure.conditions import watch

    with watch() as machine:  # what else used the machine meanwhile: a busy run is no measurement
        main()
    print(f"machine while this ran: {machine.conditions}")
