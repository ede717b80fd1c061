"""lab.expect judged (issue 42): from one measured, traced base run, the calibrated expectation of
each single change of the toggle ladder and of pairs of them, against the run of that setting
measured AFTER the expectation was made, on the Lab's built-in GPT and two small transformers
models (Llama-class, GPT-2-class; random init from a config).

Goal on a quiet CPU: median |error| <= 7% and worst <= 20% for the step time; peak memory within
5%. A run measured on a busy machine (its conditions, or the base's) is printed but the table is
"busy: not judged". Nothing is fitted to these runs: each expectation takes the plan's device model
(measured sweeps of this CPU, core/efficiency.py's constants with their sources) and the base run of
the same Lab, nothing else; every judged run comes after its expectation.

The ladder (each from the base setting): checkpointing flipped, micro-batch x2 and /2, sequence x2
(within the model's positions), grad_accum x2, each other optimizer of adamw / sgd / adafactor,
attention eager <-> sdpa, bf16 where this CPU runs it; pairs of those (--quick: a few).

It also times lab.expect's answers (``--speed``): the first answer (the plan's device figures
read), a new shape, the same shape again, for the built-in GPT presets and a 100M-parameter
transformers model (GPT-2 small's config, random init).

    .venv/bin/python benchmarks/bench_expect.py            # the full ladder, three models (long)
    .venv/bin/python benchmarks/bench_expect.py --quick    # a small ladder on the built-in GPT
    .venv/bin/python benchmarks/bench_expect.py --speed    # answer times only
    .venv/bin/python benchmarks/bench_expect.py --rebase   # the base measured again before each rung
"""
import itertools
import os
import statistics
import sys
import time
import warnings

import tunekit
from tunekit.core.registry import LAB_OPTIMIZERS

warnings.filterwarnings("ignore")
MiB = 2**20
GOAL_MEDIAN, GOAL_WORST, GOAL_PEAK = 0.07, 0.20, 0.05


def labs(quick: bool):
    """(name, Lab) of the models judged: the built-in GPT; with the full ladder, a Llama-class and a
    GPT-2-class transformers model too (small, random init)."""
    yield "GPT cpu-tiny", tunekit.Lab(micro_batch=8, seq_len=128, log_path="/tmp/bench_expect.jsonl")
    if quick:
        return
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    llama = LlamaConfig(vocab_size=512, hidden_size=128, intermediate_size=344, num_hidden_layers=4,
                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    yield "Llama 4x128", tunekit.Lab(LlamaForCausalLM(llama), micro_batch=4, seq_len=64,
                                     log_path="/tmp/bench_expect.jsonl")
    gpt2 = GPT2Config(vocab_size=512, n_embd=128, n_layer=4, n_head=4, n_positions=256)
    yield "GPT-2 4x128", tunekit.Lab(GPT2LMHeadModel(gpt2), micro_batch=4, seq_len=64,
                                     log_path="/tmp/bench_expect.jsonl")


def ladder(lab, quick: bool) -> list:
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
        keep = {"ckpt on", "ckpt off", "mb x2", "sgd"}
        singles = [s for s in singles if s[0] in keep]
    pairs = [(f"{a} + {b}", {**ca, **cb}) for (a, ca), (b, cb) in itertools.combinations(singles, 2)
             if not set(ca) & set(cb)]
    return singles + (pairs[:2] if quick else pairs)


def judged_rows(name, lab, steps, warmup, quick, rebase=False):
    """Run the base (traced), then for each rung: lab.expect first, the run after. ``rebase``: the
    base measured again (traced) before each rung, so that a machine whose speed drifts over
    minutes calibrates each expectation from a run just before it (still a run made before)."""
    base = lab.run(steps=steps, warmup=warmup, trace=True, verbose=False)
    print(f"\n{name}: base {base.label} {base.step_s * 1e3:.1f} ms, peak {base.peak_mem_bytes / MiB:.0f} MiB "
          f"({base.conditions.verdict if base.conditions else '?'})", flush=True)
    print(f"{'change':<28}{'exp ms':>9}{'meas ms':>9}{'error':>8}{'exp MiB':>9}{'meas MiB':>9}{'peak err':>9}"
          f"{'answer s':>9}  machine")
    rows = []
    for label, changes in ladder(lab, quick):
        if rebase:
            base = lab.run(steps=steps, warmup=warmup, trace=True, verbose=False)
        t0 = time.perf_counter()
        try:
            e = lab.expect(base=base, **changes)
        except Exception as exc:   # noqa: BLE001 - a rung this model cannot take is said and skipped
            print(f"{label:<28}expect failed: {type(exc).__name__}: {str(exc)[:80]}")
            continue
        answer_s = time.perf_counter() - t0
        r = lab.run(steps=steps, warmup=warmup, verbose=False, **changes)   # measured after the expectation
        err, perr = e.step_s / r.step_s - 1, e.peak_bytes / r.peak_mem_bytes - 1
        verdict = r.conditions.verdict if r.conditions else "unknown"
        rows.append((name, label, err, perr, verdict))
        print(f"{label:<28}{e.step_s * 1e3:>9.1f}{r.step_s * 1e3:>9.1f}{err:>+8.1%}{e.peak_bytes / MiB:>9.0f}"
              f"{r.peak_mem_bytes / MiB:>9.0f}{perr:>+9.1%}{answer_s:>9.2f}  {verdict}", flush=True)
    base_verdict = base.conditions.verdict if base.conditions else "unknown"
    return rows, base_verdict


def judge(rows, verdicts) -> None:
    """The median and worst |error| against the goal; a busy machine is not judged."""
    if not rows:
        print("no rows")
        return
    errs = [abs(r[2]) for r in rows]
    perrs = [abs(r[3]) for r in rows]
    busy = any(v != "quiet" for v in verdicts) or any(r[4] != "quiet" for r in rows)
    med, worst, pworst = statistics.median(errs), max(errs), max(perrs)
    print(f"\nstep time |error|: median {med:.1%} (goal <= {GOAL_MEDIAN:.0%}), worst {worst:.1%} "
          f"(goal <= {GOAL_WORST:.0%}); peak |error|: median {statistics.median(perrs):.1%}, worst {pworst:.1%} "
          f"(goal <= {GOAL_PEAK:.0%}); {len(rows)} settings")
    if busy:
        print("machine: busy: not judged (a run or its base was measured under load; rerun when quiet)")
        return
    ok = med <= GOAL_MEDIAN and worst <= GOAL_WORST and pworst <= GOAL_PEAK
    print("machine: quiet; " + ("goal met" if ok else "goal NOT met"))


def speed() -> None:
    """Seconds per lab.expect answer: the first (device figures read), a new shape, the same again."""
    from transformers import GPT2Config, GPT2LMHeadModel

    models = [("GPT cpu-tiny", lambda: tunekit.Lab(log_path="/tmp/bench_expect.jsonl")),
              ("GPT cpu-small", lambda: tunekit.Lab(preset="cpu-small", log_path="/tmp/bench_expect.jsonl")),
              ("GPT gpt2-124m", lambda: tunekit.Lab(preset="gpt2-124m", micro_batch=1, seq_len=128,
                                                    log_path="/tmp/bench_expect.jsonl")),
              ("HF GPT-2 124M (random init)", lambda: tunekit.Lab(GPT2LMHeadModel(GPT2Config()), micro_batch=1,
                                                                  seq_len=128, log_path="/tmp/bench_expect.jsonl"))]
    print(f"{'model':<30}{'first s':>9}{'new shape s':>13}{'again s':>9}  (target: new shape <= 1 s GPT, <= 3 s 100M)")
    for name, make in models:
        lab = make()
        mb = lab.resolve().micro_batch
        times = []
        for changes in ({}, {"micro_batch": mb * 2}, {"micro_batch": mb * 2, "lr": 1e-4}):
            t0 = time.perf_counter()
            lab.expect(**changes)
            times.append(time.perf_counter() - t0)
        print(f"{name:<30}{times[0]:>9.2f}{times[1]:>13.2f}{times[2]:>9.3f}", flush=True)


def machine_load() -> str:
    return f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"


def main():
    quick = "--quick" in sys.argv
    print(f"machine at start: {machine_load()}")
    if "--speed" in sys.argv:
        speed()
        return
    steps, warmup = (5, 2) if quick else (15, 3)
    rows, verdicts = [], []
    for name, lab in labs(quick):
        got, v = judged_rows(name, lab, steps, warmup, quick, "--rebase" in sys.argv)
        rows += got
        verdicts.append(v)
    judge(rows, verdicts)
    print(f"machine at end: {machine_load()}")


if __name__ == "__main__":
    main()
