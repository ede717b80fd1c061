"""lab.expect judged (issue 42): from one measured, traced base run, the calibrated expectation of
each single change of the toggle ladder and of pairs of them, against that setting measured AFTER
the expectation was made, on the Lab's built-in GPT and two small transformers models (Llama-class,
GPT-2-class; random init from a config).

Goal on a quiet CPU: median |error| <= 7% and worst <= 20% for the step time; peak memory within 5%.

The calibration: ONE traced base run, made before any judged run; every expectation is made from it
(``lab.expect(base=run, ...)``) just before its setting's first measured block, nothing else.

The measured side, made to hold on a shared VM whose speed moves by more than the goal within
minutes (RESULTS.md: the base measured again at the end of a ladder was 22% off itself, quiet):

- interleaved blocks: each round measures the base ("A"), the changed settings (their order turned
  by one each round, so none always follows the same neighbour) and the base again ("A'") in the
  middle of the round; ``ROUNDS`` rounds. Host drift over minutes lands on every setting alike;
- each block is one ``lab.run``: ``WARMUP`` untimed steps after the toggle change (what a setting
  change costs once: a new optimizer's state made at its first step, the allocator's growth to a new
  size at the first two, the FLOP probe before them; the last of them runs inside the peak meter,
  so the pages its malloc_trim handed back are faulted in before the clock), then ``BLOCK_STEPS``
  timed ones, their median;
- a setting's step time is the MINIMUM of its blocks' medians (a block is only ever slowed by the
  machine's other work, never sped up);
- judged as ratios to the base measured beside it: error = (expected / base expected) / (measured /
  base measured) - 1, so the host's speed cancels; the base expected is the calibrating run's step;
- the A/A check: the base against itself, min(A') / min(A), the same estimator over the same number
  of blocks. A row is judged only when the A/A spread is below ``AA_LIMIT`` (half the median goal)
  and the blocks its figures come from were measured quiet; otherwise it says "not judged (A/A
  spread X%)" or "not judged (busy)";
- glibc keeps its freed heap pages: the script re-executes itself with ``train.record.TUNABLES``
  (MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=1073741824) and says so, unless the user
  set either (theirs stand) or gave ``--glibc-heap`` (glibc's defaults). By default a step larger
  than those before grows the heap, free() trims it at the step's end and the next step faults it
  in again: the built-in GPT at mb 16 216-4,162 faults a step, 1.0-1.5 us each, a count that
  depends on what ran before (bench_mb_growth.py). The peak meter's malloc_trim at each block's
  start stays (the peak is measured from a settled floor: tests/measure/test_device_meter_start.py);
  the pages it hands back come in again in the last warm-up step, off the clock;
  Kept, the built-in GPT's mb 16 blocks fault 3-6x fewer pages a step; a few hundred a step remain
  at every size with either heap (not glibc's: PYTHONMALLOC=malloc leaves them), under 1% of a step;
- each block's page faults a timed step (``RunResult.minor_faults_per_step``), and for the base's
  blocks the share of time a task waited for a CPU and the steal, are printed: whether a slow block
  was the heap's or the host's. (The small Llama's base blocks fault ~30-190 pages a step with
  either heap, slow or fast: its A/A spread is not the heap's.)

Nothing is fitted to these runs: each expectation takes the plan's device model (measured sweeps
of this CPU, core/efficiency.py's constants with their sources) and the base run of the same Lab.

The ladder (each from the base setting): checkpointing flipped, micro-batch x2 and /2, sequence x2
(within the model's positions), grad_accum x2, each other optimizer of adamw / sgd / adafactor,
attention eager <-> sdpa, bf16 where this CPU runs it; pairs of those (--quick: a few).

It also times lab.expect's answers (``--speed``: bench_expect_speed.py). The runs' log goes to a
temporary folder, removed at the end. ``--help``: every option.

    .venv/bin/python benchmarks/bench_expect.py            # the full ladder, three models (long)
    .venv/bin/python benchmarks/bench_expect.py --quick    # a small ladder on the built-in GPT
    .venv/bin/python benchmarks/bench_expect.py --quick --mb   # with mb /2 and adafactor too (~2 min quiet)
    .venv/bin/python benchmarks/bench_expect.py --quick --rounds 8   # more rounds (default 6)
    .venv/bin/python benchmarks/bench_expect.py --threads 1   # torch on one thread (--help: why)
    .venv/bin/python benchmarks/bench_expect.py --quick --priority   # each block ahead of other work
"""
import argparse
import itertools
import math
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import tunekit
from tunekit.core.registry import LAB_OPTIMIZERS
from tunekit.measure.priority import ahead, level, shielded_verdict
from tunekit.train.record import TUNABLES, tunables_words

warnings.filterwarnings("ignore")
MiB = 2**20
GOAL_MEDIAN, GOAL_WORST, GOAL_PEAK = 0.07, 0.20, 0.05
# the base against itself may differ by at most half the median error judged: a measurement that
# disagrees with itself by more cannot tell a 7% model error from its own noise
AA_LIMIT = GOAL_MEDIAN / 2
# per block: warm-up steps after its toggle change, then timed steps (their median); rounds of blocks
WARMUP, BLOCK_STEPS, ROUNDS, BASE_STEPS = 3, 10, 6, 15
JUDGED = ("quiet", "busy, measured ahead of it")   # a run at real-time priority ran ahead of the load
A, A2 = "A", "A'"   # the base's two blocks of each round


def labs(quick: bool, log_path: str, model: str | None = None):
    """(name, Lab) of the models judged: the built-in GPT; with the full ladder, a Llama-class and a
    GPT-2-class transformers model too (small, random init). ``model``: only those whose name holds it
    (any case), quick or not."""
    def hf(config, causal, **kw):
        import transformers

        lm = getattr(transformers, causal)(getattr(transformers, config)(**kw))
        return tunekit.Lab(lm, micro_batch=4, seq_len=64, log_path=log_path)

    made = [("GPT cpu-tiny", lambda: tunekit.Lab(micro_batch=8, seq_len=128, log_path=log_path)),
            ("Llama 4x128", lambda: hf("LlamaConfig", "LlamaForCausalLM", vocab_size=512, hidden_size=128,
                                       intermediate_size=344, num_hidden_layers=4, num_attention_heads=4,
                                       num_key_value_heads=2, max_position_embeddings=256)),
            ("GPT-2 4x128", lambda: hf("GPT2Config", "GPT2LMHeadModel", vocab_size=512, n_embd=128, n_layer=4,
                                       n_head=4, n_positions=256))]
    for name, make in made if model or not quick else made[:1]:
        if model is None or model.lower() in name.lower():
            yield name, make()


def ladder(lab, quick: bool, mb: bool = False) -> list:
    """(label, changes) of each single change from the Lab's base setting, then pairs."""
    t, env = lab.resolve(), lab.env()
    singles = [("ckpt " + ("off" if t.checkpointing else "on"), {"checkpointing": not t.checkpointing}),
               ("mb x2", {"micro_batch": t.micro_batch * 2})]
    if t.micro_batch > 1:
        singles.append(("mb /2", {"micro_batch": t.micro_batch // 2}))
    limit = lab.adapter.default_seq_len(lab.device.type)
    if limit is None or t.seq_len * 2 <= limit:
        singles.append(("seq x2", {"seq_len": t.seq_len * 2}))
    singles.append(("accum x2", {"grad_accum": t.grad_accum * 2}))
    singles += [(o, {"optimizer": o}) for o in ("adamw", "sgd", "adafactor")
                if o != t.optimizer and o in LAB_OPTIMIZERS and o not in env.unavailable_optimizers]
    if env.can_set_attention:
        other = "sdpa" if t.attention in ("math", "eager") else "eager"
        singles.append((f"attn {other}", {"attention": other}))
    if env.bf16_supported and t.precision != "bf16":
        singles.append(("bf16", {"precision": "bf16"}))
    if quick:
        keep = {"ckpt on", "ckpt off", "mb x2", "sgd"} | ({"mb /2", "adafactor"} if mb else set())
        singles = [s for s in singles if s[0] in keep]
    pairs = [(f"{a} + {b}", {**ca, **cb}) for (a, ca), (b, cb) in itertools.combinations(singles, 2)
             if not set(ca) & set(cb)]
    return singles + (pairs[:2] if quick else pairs)


# --- the measured side: interleaved blocks, pure (tests/project/test_bench_expect.py) -------------

def schedule(n_changes: int, rounds: int) -> list[list]:
    """The blocks of each round: the base ``A``, the changed settings 0..n-1 turned by one place each
    round, the base again ``A'`` after the first half of them. E.g. 3 changes, 2 rounds:
    [[A, 0, 1, A', 2], [A, 1, 2, A', 0]]."""
    half = (n_changes + 1) // 2
    out = []
    for r in range(rounds):
        turned = [(i + r) % n_changes for i in range(n_changes)] if n_changes else []
        out.append([A, *turned[:half], A2, *turned[half:]])
    return out


def setting_time(medians) -> float:
    """A setting's step time from its blocks' medians: the fastest (the machine's other work only
    ever slows a block); NaN without blocks."""
    return min(medians) if medians else math.nan


def aa_spread(base_medians, again_medians) -> float:
    """The A/A check: the base's two interleaved series, each by `setting_time`, larger over smaller
    less one (NaN when either is missing)."""
    a, b = setting_time(base_medians), setting_time(again_medians)
    return max(a, b) / min(a, b) - 1 if a > 0 and b > 0 else math.nan


def ratio_error(exp_s: float, exp_base_s: float, meas_s: float, meas_base_s: float) -> float:
    """The expected ratio to the base against the measured ratio to the base measured beside it, less one."""
    return (exp_s / exp_base_s) / (meas_s / meas_base_s) - 1


def row_status(aa: float, verdicts, limit: float = AA_LIMIT) -> str:
    """"judged", or why a row is not: the A/A spread at or over ``limit`` (or unknown), or a block
    its figures come from measured busy."""
    if not aa < limit:
        return f"not judged (A/A spread {aa:.1%})"
    busy = [v for v in verdicts if v not in JUDGED]
    return f"not judged ({busy[0]})" if busy else "judged"


# --- the runs -------------------------------------------------------------------------------------

def block(lab, steps, warmup, priority, **changes):
    """One block: ``lab.run`` of a setting, ``warmup`` untimed steps after its toggle change, then
    ``steps`` timed ones; with ``priority``, ahead of the machine's other work (measure.priority).
    Returns (RunResult, machine verdict)."""
    if not priority:
        r = lab.run(steps=steps, warmup=warmup, verbose=False, **changes)
        return r, r.conditions.verdict if r.conditions else "unknown"
    with ahead() as got:
        r = lab.run(steps=steps, warmup=warmup, verbose=False, **changes)
    return r, shielded_verdict(r.conditions, got)


def interleaved(lab, rungs, base, rounds, steps, warmup, priority) -> dict:
    """Measure the base and every rung in interleaved rounds (`schedule`); each rung's expectation is
    made (from ``base``, the one calibrating run) right before its first block. Returns per key (A, A',
    rung index): {"medians": [...], "verdicts": [...], "first": first block's RunResult, "expect": ...,
    "answer_s": ...}."""
    got = {k: {"medians": [], "verdicts": [], "faults": [], "conds": []} for k in (A, A2, *range(len(rungs)))}
    for r, order in enumerate(schedule(len(rungs), rounds)):
        t0, line = time.perf_counter(), []
        for key in order:
            changes = rungs[key][1] if isinstance(key, int) else {}
            g = got[key]
            if "expect" not in g:
                t1 = time.perf_counter()
                try:
                    g["expect"] = lab.expect(base=base, **changes)
                except Exception as exc:   # noqa: BLE001 - a rung this model cannot take is said and skipped
                    g["expect"] = exc
                g["answer_s"] = time.perf_counter() - t1
            if isinstance(g["expect"], Exception):
                continue
            run, verdict = block(lab, steps, warmup, priority, **changes)
            g.setdefault("first", run)
            g["medians"].append(run.steady_step_s)
            g["verdicts"].append(verdict)
            g["faults"].append(run.minor_faults_per_step)
            g["conds"].append(run.conditions)
            line.append(f"{key if isinstance(key, str) else rungs[key][0]} {run.steady_step_s * 1e3:.1f} "
                        f"[{run.minor_faults_per_step:.0f}]")
        print(f"  round {r + 1}/{rounds} ({time.perf_counter() - t0:.0f} s): " + ", ".join(line)
              + " ms [page faults a timed step]", flush=True)
    return got


def fastest_verdict(g) -> str:
    """The verdict of the block whose median is the setting's time."""
    return g["verdicts"][g["medians"].index(setting_time(g["medians"]))] if g["medians"] else "unknown"


HEAD = (f"{'change':<24}{'exp ms':>8}{'exp x':>7}{'meas ms':>9}{'meas x':>8}{'blocks':>8}{'faults':>8}{'error':>8}"
        f"{'exp MiB':>9}{'meas MiB':>9}{'peak err':>9}{'answer s':>9}{'uncal':>7}  status")


def uncalibrated_share(e) -> float:
    """The share of an expectation's step at the device model uncalibrated (rows ``by`` "device
    model": ops new to the setting, or whose kernels run at other dtypes than the base measured)."""
    return sum(r[5] for r in e.rows if r[6] == "device model") / e.step_s if e.step_s > 0 else math.nan


def carry_notes(e) -> list:
    """What the calibration of an expectation could not carry (its notes of those kinds), in words."""
    return [str(n) for n in e.notes if n.kind in ("expect.other_dtype", "expect.outlier")]


def judged_rows(name, lab, quick, mb, rounds, steps, warmup, priority, most_rows=None):
    """The one calibrating run (traced), then the interleaved blocks; prints the A/A check and one row
    per rung (``most_rows``: the first so many). Returns (rows: (model, label, step error, peak error, status), A/A)."""
    base, base_verdict = block(lab, BASE_STEPS, warmup, priority, trace=True)
    print(f"\n{name}: calibrating run {base.label} {base.steady_step_s * 1e3:.1f} ms (median of {base.steps}), "
          f"peak {base.peak_mem_bytes / MiB:.0f} MiB ({base_verdict})", flush=True)
    rungs = ladder(lab, quick, mb)[:most_rows]
    got = interleaved(lab, rungs, base, rounds, steps, warmup, priority)
    a, a2 = got[A], got[A2]
    aa, meas_base = aa_spread(a["medians"], a2["medians"]), setting_time(a["medians"])
    exp_base = a["expect"].step_s   # the calibrating run's step, as lab.expect carries it
    print(f"A/A: the base's blocks {_blocks(a)} and again {_blocks(a2)} ms [page faults a timed step, CPU wait, "
          f"steal]: fastest "
          f"{meas_base * 1e3:.1f} and {setting_time(a2['medians']) * 1e3:.1f} ms, spread {aa:.1%} (bound "
          f"{AA_LIMIT:.1%}); the calibrating run measured {base.steady_step_s / meas_base - 1:+.1%} off the "
          f"interleaved base (drift, cancelled by the ratios)")
    print(HEAD)
    rows, said = [], {}
    for i, (label, _changes) in enumerate(rungs):
        g = got[i]
        if isinstance(g["expect"], Exception):
            print(f"{label:<24}expect failed: {type(g['expect']).__name__}: {str(g['expect'])[:80]}")
            continue
        e, meas = g["expect"], setting_time(g["medians"])
        err = ratio_error(e.step_s, exp_base, meas, meas_base)
        peak = g["first"].peak_mem_bytes or math.nan   # a run with no peak meter: NaN
        perr = e.peak_bytes / peak - 1
        status = row_status(aa, [fastest_verdict(g), fastest_verdict(a)])
        blocks = max(g["medians"]) / meas - 1
        print(f"{label:<24}{e.step_s * 1e3:>8.1f}{e.step_s / exp_base:>7.2f}{meas * 1e3:>9.1f}{meas / meas_base:>8.2f}"
              f"{blocks:>8.0%}{statistics.median(g['faults']):>8.0f}"
              f"{err:>+8.1%}{e.peak_bytes / MiB:>9.0f}{peak / MiB:>9.0f}{perr:>+9.1%}"
              f"{g['answer_s']:>9.2f}{uncalibrated_share(e):>7.0%}  {status}", flush=True)
        rows.append((name, label, err, perr, status))
        for note in carry_notes(e):
            said.setdefault(note, label)
    for note, label in said.items():   # once each, with the first row that said it
        print(f"  {label}: {note}")
    return rows, aa


def _blocks(g) -> str:
    """Each block's median (ms) [its page faults a timed step, the share of its time some task waited
    for a CPU, the hypervisor's steal]: a slow block's cause, the heap's or the host's."""
    return ", ".join(f"{m * 1e3:.1f} [{f:.0f}, {getattr(c, 'cpu_wait', math.nan):.0%}, "
                     f"{getattr(c, 'steal', math.nan):.0%}]" for m, f, c in zip(g["medians"], g["faults"], g["conds"]))


def judge(rows, spreads) -> None:
    """The median and worst |error| of the judged rows against the goal; the rest counted, with why."""
    if not rows:
        print("no rows")
        return
    kept = [r for r in rows if r[4] == "judged"]
    for what, rs in (("all rows", rows), ("judged rows", kept)):
        if not rs:
            print(f"{what}: none")
            continue
        errs, perrs = [abs(r[2]) for r in rs], [abs(r[3]) for r in rs if not math.isnan(r[3])]
        print(f"{what}: step time |error| median {statistics.median(errs):.1%} (goal <= {GOAL_MEDIAN:.0%}), worst "
              f"{max(errs):.1%} (goal <= {GOAL_WORST:.0%}); peak |error| median "
              f"{statistics.median(perrs) if perrs else math.nan:.1%}, worst {max(perrs, default=math.nan):.1%} "
              f"(goal <= {GOAL_PEAK:.0%}); {len(rs)} settings")
    print("A/A spread: " + ", ".join(f"{n} {s:.1%}" for n, s in spreads) + f" (bound {AA_LIMIT:.1%})")
    print(by_model(rows, spreads))
    errs = [abs(r[2]) for r in kept]
    perrs = [abs(r[3]) for r in rows if not math.isnan(r[3])]
    ok = bool(kept) and statistics.median(errs) <= GOAL_MEDIAN and max(errs) <= GOAL_WORST
    peak_ok = bool(perrs) and max(perrs) <= GOAL_PEAK
    left = len(rows) - len(kept)
    print(f"step time goal {'met' if ok else 'NOT met' if kept else 'not judged'}, peak goal "
          f"{'met' if peak_ok else 'NOT met'}" + (f"; {left} of {len(rows)} rows not judged (A/A spread over "
                                                  f"the bound, or busy): rerun them when quiet" if left else ""))


def by_model(rows, spreads) -> str:
    """Per model and over all, every row (judged or not): the step time |error| median and worst
    (which row), the same without the bf16 rows, the peak's worst, the A/A spread."""
    aa = dict(spreads)
    out = [f"{'model':<14}{'settings':>9}{'median':>8}  {'worst':<28}{'without bf16 rows':<24}{'peak worst':>11}"
           f"{'A/A':>7}"]
    for model in [*dict.fromkeys(r[0] for r in rows), "all"]:
        rs = [r for r in rows if model in ("all", r[0])]
        worst = max(rs, key=lambda r: abs(r[2]))
        plain = [abs(r[2]) for r in rs if "bf16" not in r[1]]
        without = f"{statistics.median(plain):.1%}, {max(plain):.1%}" if plain else "-"
        perrs = [abs(r[3]) for r in rs if not math.isnan(r[3])]
        out.append(f"{model:<14}{len(rs):>9}{statistics.median(abs(r[2]) for r in rs):>8.1%}  "
                   f"{f'{abs(worst[2]):.1%} ({worst[1]})':<28}{without:<24}{max(perrs, default=math.nan):>11.1%}"
                   f"{aa[model] if model in aa else math.nan:>7.1%}".replace("   nan%", "      -"))
    return "\n".join(out)


def machine_load() -> str:
    return f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"


def parse_args(argv=None) -> argparse.Namespace:
    """The command line (``argv``, else sys.argv's): an unknown option is refused before any work."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for flag, words in (("--quick", "a small ladder on the built-in GPT"), ("--mb", "with --quick: mb /2, adafactor"),
                        ("--priority", "each block ahead of other work (measure.priority)"),
                        ("--speed", "lab.expect's answer times only"), ("--glibc-heap", "glibc's heap defaults")):
        ap.add_argument(flag, action="store_true", help=words)
    ap.add_argument("--rounds", type=int, default=ROUNDS, help=f"rounds of blocks (default {ROUNDS})")
    ap.add_argument("--threads", type=int, default=0, help="torch's threads (default 0: its own; on a busy machine 2 "
                    "threads spin in libgomp's barriers, 4x slower than 1; the CPU's figures are at the default)")
    ap.add_argument("--rows", type=int, help="only the first ROWS rungs of each model")
    ap.add_argument("--model", help="only the models whose name holds MODEL (any case)")
    return ap.parse_args(argv)


def heap_env(environ, glibc_heap: bool) -> dict | None:
    """The environment to run the measured process in where glibc should keep its freed heap pages
    (record.TUNABLES): ``environ`` with them added; None where the user set either (theirs stand) or
    asked for glibc's defaults (``--glibc-heap``)."""
    return None if glibc_heap or any(k in environ for k in TUNABLES) else {**environ, **TUNABLES}


def main(args: argparse.Namespace):
    env = heap_env(os.environ, args.glibc_heap)
    if env is not None:   # the tunables act from the process's start: re-executed with them (argv parsed)
        print(f"re-executing with {tunables_words()} (glibc keeps freed heap pages; --glibc-heap: not)", flush=True)
        os.execve(sys.executable, [sys.executable, *sys.argv], env)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    print(f"machine at start: {machine_load()}" + (f"; blocks at {level()} priority" if args.priority else "")
          + (f"; torch on {args.threads} thread(s)" if args.threads else "") + "; glibc's heap: "
          + (" ".join(f"{k}={os.environ[k]}" for k in TUNABLES if k in os.environ) or "defaults"))
    with tempfile.TemporaryDirectory(prefix="bench_expect-") as folder:
        log_path = str(Path(folder) / "runs.jsonl")
        if args.speed:   # (its own script: bench_expect_speed.py)
            from bench_expect_speed import speed

            speed(log_path)
            return
        print(f"one calibrating run ({BASE_STEPS} timed steps, traced); then {args.rounds} rounds of interleaved "
              f"blocks (the base twice, each change once), each block {WARMUP} warm-up steps after its toggle change "
              f"and {BLOCK_STEPS} timed: its median; a setting's time is its fastest block's; judged as ratios to the "
              f"interleaved base; a row is judged when the A/A spread is under {AA_LIMIT:.1%}")
        t0 = time.perf_counter()
        rows, spreads = [], []
        for name, lab in labs(args.quick, log_path, args.model):
            got, aa = judged_rows(name, lab, args.quick, args.mb, args.rounds, BLOCK_STEPS, WARMUP, args.priority,
                                   args.rows)
            rows += got
            spreads.append((name, aa))
        print()
        judge(rows, spreads)
        print(f"machine at end: {machine_load()}; {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main(parse_args())
