"""Sequence growth on GPT-2 with dropout (issue 42 item 3): lab.expect's sequence x2 rows on the
GPT-2 4x128 Lab of benchmarks/bench_expect.py, expected without and with dropout's random fill
(bernoulli_) at this CPU's measured rate (measure.rng), against the same settings measured.

1. the plan's op table at seq 64 and 128 (the ops whose time grows with the sequence), both ways;
2. (--trace) torch.profiler's self time per aten op of real steps at seq 64 and 128, alternated,
   the fastest of ``--rounds`` traces each: the growth the plan should show;
3. bench_expect's measured side (one traced base run, interleaved blocks, ratios to the base) for
   seq x2, ckpt on and ckpt on + seq x2, each expected both ways from the same base run.

Nothing is fitted: "before" is the plan with no random-fill rate (its bytes at the bandwidth, as
before), "after" the measured rate.

    .venv/bin/python benchmarks/bench_seq_dropout.py             # op tables and judged rows
    .venv/bin/python benchmarks/bench_seq_dropout.py --trace     # and the profiler's per-op growth
    .venv/bin/python benchmarks/bench_seq_dropout.py --rounds 6  # more rounds (default 4)
"""
import argparse
import sys
import tempfile
import time
import warnings
from contextlib import contextmanager
from pathlib import Path


def parse_args(argv=None) -> argparse.Namespace:
    """The command line (``argv``, else sys.argv's): an unknown option is refused before any work."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", action="store_true", help="also torch.profiler's per-op growth")
    ap.add_argument("--rounds", type=int, default=4, help="rounds of traces and of blocks (default 4)")
    return ap.parse_args(argv)


if __name__ == "__main__":   # the options first (tests/project/test_bench_args.py)
    ARGS = parse_args()

import tunekit
from tunekit.lab import expect as lab_expect
from tunekit.measure import rng

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_expect as be  # noqa: E402

warnings.filterwarnings("ignore")
GROWING = ("bernoulli_", "bmm", "_softmax", "_safe_softmax", "_softmax_backward_data", "mul", "div_", "where",
           "mm", "addmm", "add")


@contextmanager
def without_rng():
    """Plans made inside take no random-fill rate: the bernoulli_ at its bytes, as before issue 42."""
    saved = rng.measure_rng
    rng.measure_rng = lambda refresh=False: {"rates": {}, "verdict": "quiet"}
    try:
        yield
    finally:
        rng.measure_rng = saved


def fresh(lab):
    lab_expect._PLANS.pop(lab, None)   # plans are cached per Lab: the next expect plans again


def op_tables(model) -> None:
    tables = {}
    for way, ctx in (("before", without_rng), ("after", None)):
        for seq in (64, 128):
            with ctx() if ctx else _null():
                p = tunekit.plan(model, device="cpu", micro_batch=4, seq_len=seq, verbose=False)
            tables[way, seq] = p.expected.by_op.set_index("op"), p.expected.step_s
    print("\nplan op table (ms), GPT-2 4x128 micro-batch 4: seq 64 -> 128")
    print(f"{'op':<26}{'calls':>6}{'before 64':>11}{'128':>8}{'x':>6}{'after 64':>10}{'128':>8}{'x':>6}")
    for op in GROWING:
        cells = []
        for way in ("before", "after"):
            a, b = (tables[way, s][0].expected_s.get(op, 0.0) * 1e3 for s in (64, 128))
            cells.append(f"{a:>10.3f}{b:>8.3f}{b / a if a else float('nan'):>6.2f}")
        calls = tables["after", 64][0].calls.get(op, 0)
        print(f"{op:<26}{calls:>6} {cells[0]}{cells[1]}")
    for way in ("before", "after"):
        a, b = tables[way, 64][1], tables[way, 128][1]
        print(f"step ({way}): {a * 1e3:.2f} -> {b * 1e3:.2f} ms, x{b / a:.3f}")


@contextmanager
def _null():
    yield


def traced_growth(model, rounds: int) -> None:
    """Self time per aten op at seq 64 and 128, alternated; the fastest of ``rounds`` traces each."""
    from collections import defaultdict

    import torch
    from torch.profiler import ProfilerActivity, profile

    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model.train()

    def step(seq):
        x = torch.randint(0, model.config.vocab_size, (4, seq))
        model(input_ids=x, labels=x).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for seq in (64, 128, 64, 128):
        step(seq)
    best = {64: {}, 128: {}}
    for _ in range(rounds):
        for seq in (64, 128):
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                for _ in range(3):
                    step(seq)
            got = defaultdict(float)
            for e in prof.key_averages():
                if e.key.startswith("aten::"):
                    got[e.key[6:]] += e.self_cpu_time_total / 3 / 1e3
            for k, v in got.items():
                best[seq][k] = min(best[seq].get(k, v), v)
    print(f"\ntraced self time per step (ms), fastest of {rounds} traces of 3 steps, alternated")
    print(f"{'op':<26}{'seq 64':>9}{'seq 128':>9}{'x':>7}")
    for op in GROWING:
        a, b = best[64].get(op, 0.0), best[128].get(op, 0.0)
        print(f"{op:<26}{a:>9.3f}{b:>9.3f}{b / a if a else float('nan'):>7.2f}")
    a, b = sum(best[64].values()), sum(best[128].values())
    print(f"{'all aten ops':<26}{a:>9.3f}{b:>9.3f}{b / a:>7.2f}")


def judged(model, rounds: int, log_path: str) -> None:
    lab = tunekit.Lab(model, micro_batch=4, seq_len=64, log_path=log_path)
    base, verdict = be.block(lab, be.BASE_STEPS, be.WARMUP, False, trace=True)
    print(f"\ncalibrating run {base.steady_step_s * 1e3:.1f} ms ({verdict})", flush=True)
    rungs = [("seq x2", {"seq_len": 128}), ("ckpt on", {"checkpointing": True}),
             ("ckpt on + seq x2", {"checkpointing": True, "seq_len": 128})]
    fresh(lab)
    got = be.interleaved(lab, rungs, base, rounds, be.BLOCK_STEPS, be.WARMUP, False)
    a, a2 = got[be.A], got[be.A2]
    meas_base, aa = be.setting_time(a["medians"]), be.aa_spread(a["medians"], a2["medians"])
    fresh(lab)
    with without_rng():
        before = {i: lab.expect(base=base, **c) for i, (_, c) in enumerate(rungs)}
        before_base = lab.expect(base=base).step_s
    fresh(lab)
    exp_base = a["expect"].step_s
    print(f"A/A spread {aa:.1%} (bound {be.AA_LIMIT:.1%})")
    print(f"{'change':<20}{'meas x':>8}{'before x':>10}{'error':>8}{'after x':>9}{'error':>8}  status")
    for i, (label, _) in enumerate(rungs):
        g, meas = got[i], be.setting_time(got[i]["medians"])
        b, e = before[i].step_s / before_base, g["expect"].step_s / exp_base
        status = be.row_status(aa, [be.fastest_verdict(g), be.fastest_verdict(a)])
        print(f"{label:<20}{meas / meas_base:>8.2f}{b:>10.2f}{b / (meas / meas_base) - 1:>+8.1%}{e:>9.2f}"
              f"{e / (meas / meas_base) - 1:>+8.1%}  {status}", flush=True)


def main(args: argparse.Namespace):
    from transformers import GPT2Config, GPT2LMHeadModel

    rounds = args.rounds
    print(f"machine at start: {be.machine_load()}; dropout's random fill measured at "
          f"{ {d: f'{r / 1e6:.0f} M/s' for d, r in rng.measure_rng()['rates'].items()} }")
    t0 = time.perf_counter()
    cfg = GPT2Config(vocab_size=512, n_embd=128, n_layer=4, n_head=4, n_positions=256)
    model = GPT2LMHeadModel(cfg)
    op_tables(model)
    if args.trace:
        traced_growth(GPT2LMHeadModel(cfg), rounds)
    with tempfile.TemporaryDirectory(prefix="bench_seq_dropout-") as folder:
        judged(model, rounds, str(Path(folder) / "runs.jsonl"))
    print(f"machine at end: {be.machine_load()}; {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main(ARGS)
