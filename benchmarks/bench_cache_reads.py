"""Why an op inside a training step grows more with the tokens than the same op alone (issue 42, item
3): is it the step's working set outgrowing a cache level (the operands the backward reads, saved by
the forward, come from memory rather than the last-level cache), or the output written into pages the
kernel must fault in? The ops bench_mb_growth.py found growing most in the built-in GPT's step (its
MLP's wide [tokens x 4C] activation): gelu_backward, an elementwise multiply and the three matmul
layouts that read or write that activation, each timed at the token counts of two micro-batches (or
sequences), its operands in one of these states:

- ``written``: just written (each operand updated in place right before the op), as alone;
- ``saved S``: written, then a sweep that reads and writes S bytes, S the plan's saved activations of
  each size (`lab.plan("cpu").components["activations"]`): the op after a step's worth of other tensors;
- ``cold``: written, then a sweep of 4 x the last-level cache (sysfs's sizes, printed).

and its output either into a buffer it wrote before (``reused``, what a micro-benchmark alone gets
from the allocator) or into fresh anonymous pages (``fresh``: each 4 KiB page faulted in, zeroed by
the kernel, while the op writes it: what a step gets where glibc handed its heap's top back at the end
of the previous step; bench_mb_growth.py counts those faults op by op).

All trials run round-robin (measure.trials.interleaved: each round every trial once, each ahead of the
machine's other work where the user may ask for it); a figure is its fastest trial. Printed: the times,
each size's growth per doubling alone (written, reused), as in the step (each size after its own
saved bytes) and as in the step with the bigger size's output in fresh pages; and the seconds per
faulted page ((fresh - reused) over the pages the output spans).

    .venv/bin/python benchmarks/bench_cache_reads.py               # GPT cpu-tiny, mb 8 and 16, seq 128
    .venv/bin/python benchmarks/bench_cache_reads.py --rounds 20   # more rounds (default 12)
    .venv/bin/python benchmarks/bench_cache_reads.py --gpt2        # also GPT-2 4x128 at mb 4, seq 64 and 128
"""
import argparse
import mmap
import os
import statistics
import tempfile
import warnings

warnings.filterwarnings("ignore")
MiB, PAGE = 2**20, 4096
ROUNDS = 12


def cache_line() -> str:
    from tunekit.measure.step_host import cache_levels

    return ", ".join(f"L{k} {v // 1024} KiB" for k, v in sorted(cache_levels().items())) or "no cache sizes in sysfs"


def sizes_of(gpt2: bool) -> list:
    """[(model, tokens, wide, narrow, saved activation bytes)] of the sizes compared, from the plans."""
    import tunekit

    out = []
    with tempfile.TemporaryDirectory(prefix="bench_cache_reads-") as folder:
        lab = tunekit.Lab(micro_batch=8, seq_len=128, log_path=os.path.join(folder, "runs.jsonl"))
        c = lab.model.config.n_embd
        for mb in (8, 16):
            p = lab.plan("cpu", micro_batch=mb)
            out.append((f"GPT cpu-tiny mb {mb} seq 128", mb * 128, 4 * c, c, p.components["activations"]))
        if gpt2:
            from transformers import GPT2Config, GPT2LMHeadModel  # bench_expect.py's GPT-2 4x128

            cfg = GPT2Config(vocab_size=512, n_embd=128, n_layer=4, n_head=4, n_positions=256)
            lab = tunekit.Lab(GPT2LMHeadModel(cfg), micro_batch=4, seq_len=64, log_path=os.path.join(folder, "g.jsonl"))
            for seq in (64, 128):
                p = lab.plan("cpu", seq_len=seq)
                out.append((f"GPT-2 4x128 mb 4 seq {seq}", 4 * seq, 4 * 128, 128, p.components["activations"]))
    return out


def ops_for(tokens: int, wide: int, narrow: int) -> dict:
    """name -> (operands to write, output shape, fn(out)): the ops reading or writing [tokens x wide]."""
    import torch

    g, x = torch.randn(tokens, wide), torch.randn(tokens, wide)
    gn, down, up = torch.randn(tokens, narrow), torch.randn(wide, narrow), torch.randn(narrow, wide)
    return {
        "gelu_backward": ((g, x), (tokens, wide),
                          lambda o: torch.ops.aten.gelu_backward.grad_input(g, x, approximate="tanh", grad_input=o)),
        "mul": ((g, x), (tokens, wide), lambda o: torch.mul(g, x, out=o)),
        "mm [T,4C]@[4C,C]": ((x,), (tokens, narrow), lambda o: torch.mm(x, down, out=o)),
        "mm [4C,T]@[T,C]": ((x, gn), (wide, narrow), lambda o: torch.mm(x.t(), gn, out=o)),
        "mm [T,C]@[C,4C]": ((gn,), (tokens, wide), lambda o: torch.mm(gn, up, out=o)),
    }


def trial(operands, shape, fn, sweep_bytes: int, fresh: bool, pool):
    """A `Trial` of one op: its operands written, ``sweep_bytes`` of ``pool`` read and written, then
    the op timed, its output in a kept buffer or in ``fresh`` anonymous pages (mapped before the clock,
    faulted in by the op)."""
    import time

    import torch

    from tunekit.measure.trials import Trial

    kept = torch.zeros(shape)
    nbytes = kept.numel() * 4

    def run():
        for t in operands:
            t.mul_(1.0)
        m = mmap.mmap(-1, nbytes) if fresh else None
        out = torch.frombuffer(m, dtype=torch.float32).view(shape) if fresh else kept
        if sweep_bytes:
            pool[:sweep_bytes // 4].add_(1.0)
        t0 = time.perf_counter()
        fn(out)
        t = time.perf_counter() - t0
        if fresh:
            del out
            m.close()
        return t

    return Trial(run)


def states(sizes: list, llc: int) -> dict:
    """state name -> bytes swept between the operands' writing and the op."""
    return {"written": 0, **{f"saved {s[4] / MiB:.1f} MiB": int(s[4]) for s in sizes}, "cold": 4 * llc}


def growth(best: dict, op: str, small: tuple, big: tuple, state_of: dict) -> dict:
    """An op's time at ``big`` over ``small`` (two `sizes_of` rows, keyed by their tokens): alone
    (written, reused output), as in the step (each after its own saved bytes), the same with the big
    size's output in fresh pages, and cold; ``state_of``: tokens -> the step-like state's name."""
    a, b = small[1], big[1]
    return {"alone": best[op, b, "written", False] / best[op, a, "written", False],
            "in step": best[op, b, state_of[b], False] / best[op, a, state_of[a], False],
            "in step, faulted": best[op, b, state_of[b], True] / best[op, a, state_of[a], False],
            "cold": best[op, b, "cold", False] / best[op, a, "cold", False]}


def us_per_page(best: dict, op: str, tokens: int, out_bytes: int) -> float:
    """Microseconds one faulted page of the output adds: (fresh - reused) over its pages, written state."""
    return (best[op, tokens, "written", True] - best[op, tokens, "written", False]) / (out_bytes / PAGE) * 1e6


def parse_args(argv=None) -> argparse.Namespace:
    """The command line (``argv``, else sys.argv's): an unknown option is refused before any work."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=ROUNDS, help=f"rounds of trials (default {ROUNDS})")
    ap.add_argument("--gpt2", action="store_true", help="also GPT-2 4x128 at mb 4, seq 64 and 128")
    return ap.parse_args(argv)


def main(args: argparse.Namespace):
    import torch

    from tunekit.measure.step_host import cache_bytes
    from tunekit.measure.trials import interleaved

    rounds = args.rounds
    llc = cache_bytes() or 32 * MiB
    all_sizes = sizes_of(args.gpt2)
    pairs = [all_sizes[i:i + 2] for i in range(0, len(all_sizes), 2)]
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads; caches (cpu0, sysfs): {cache_line()}")
    for small, big in pairs:
        swept = states([small, big], llc)
        pool = torch.ones(max(swept.values()) // 4)
        trials, out_bytes = {}, {}
        for size in (small, big):
            for op, (operands, shape, fn) in ops_for(*size[1:4]).items():
                out_bytes[op, size[1]] = shape[0] * shape[1] * 4
                for state, nbytes in swept.items():
                    for fresh in (False, True):
                        trials[op, size[1], state, fresh] = trial(operands, shape, fn, nbytes, fresh, pool)
        times: dict = {}
        best = interleaved(trials, least=rounds, most=rounds, times=times)
        report(small, big, swept, best, times, out_bytes)
        del pool, trials
    print(f"load average {os.getloadavg()[0]:.1f} at the end")


def report(small, big, swept, best, times, out_bytes) -> None:
    state_of = {s[1]: f"saved {s[4] / MiB:.1f} MiB" for s in (small, big)}
    print(f"\n{small[0]} ({small[1]} tokens) against {big[0]} ({big[1]} tokens); saved activations "
          f"{small[4] / MiB:.1f} and {big[4] / MiB:.1f} MiB (the plans'); fastest ms of {len(times[next(iter(times))])}"
          " rounds (the medians' ratio in brackets)")
    cols = [(s, False) for s in swept] + [("written", True), (state_of[big[1]], True)]
    print(f"{'op':<20}{'tokens':>7}" + "".join(f"{s + (' fresh' if f else ''):>22}" for s, f in cols))
    ops = list(dict.fromkeys(k[0] for k in best))
    for op in ops:
        for size in (small, big):
            print(f"{op:<20}{size[1]:>7}" + "".join(f"{best[op, size[1], s, f] * 1e3:>22.3f}" for s, f in cols))
        g = growth(best, op, small, big, state_of)
        med = {k: statistics.median(v) for k, v in times.items()}
        gm = growth(med, op, small, big, state_of)
        pages = ", ".join(f"{us_per_page(best, op, s[1], out_bytes[op, s[1]]):.2f}" for s in (small, big))
        print("   growth per doubling: " + ", ".join(f"{k} {v:.2f}x ({gm[k]:.2f}x)" for k, v in g.items())
              + f"; a faulted page of the output {pages} us")


if __name__ == "__main__":
    main(parse_args())
