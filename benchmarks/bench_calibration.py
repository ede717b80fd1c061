"""Does a CPU calibration hold up under load? (issue 39)

Two fresh calibration caches (each a new, empty TUNEKIT_CACHE, calibrated in a child process): one
taken as the machine is, one beside `tools/busy.py --cores 2` (two processes spinning on the
cores). From each, the expected step of a few settings of the Lab's tiny GPT, the calibration's
verdict and what it took; then the busy cache's expectation over the first's. Target (issue 39):
within 10%, since every figure is the fastest of repeated trials and load only ever slows a trial.

    .venv/bin/python benchmarks/bench_calibration.py [--busy-first] [--runs R]

The first cache is only as quiet as the machine: its verdict is printed beside it (a machine shared
with other work reads busy, and the ratio then compares two loaded calibrations). ``--runs R`` does
the pair R times, alternating which goes first, and prints the spread of all 2R caches.

What varies between calibrations that no load explains (``--spread N``): N fresh caches in a row,
all as the machine is; for every figure of the stream record (measure.stream) and of the MAMF
sweep (measure.peaks), its max/min over the N caches, and how far it alone moves the expected step:
the first cache's record with that one figure taken from each of the others, planned again (the
step's max/min over those). Then each op category's expected ms over the N caches as they are.

    .venv/bin/python benchmarks/bench_calibration.py --spread 3

libgomp's wait policy (measure.conditions_gomp): the children run under the shell's environment;
``--policy P`` (repeatable: ``default``, ``OMP_WAIT_POLICY=PASSIVE``, ``GOMP_SPINCOUNT=1000`` ...)
does the pairs under each, alternated within each run, and prints each policy's pair ratios, the
spread of its caches and each cache's 64-cube fp32 matmul figure side by side:

    .venv/bin/python benchmarks/bench_calibration.py --runs 3 --policy default --policy OMP_WAIT_POLICY=PASSIVE

Before and after a change of the calibration (``--against DIR``: another checkout, e.g. ``git worktree
add /tmp/base main``): each run does the pair with this checkout's code and with DIR's, alternated,
side by side under the same load, and prints each one's pairs, spread and calibration seconds.

A constant factor (the host's speed that day) moves every setting's step alike: the summary prints
each setting's step over the first's (fp32) per cache, whose spread over the caches says whether the
settings' ratios still agree where the steps do not. ``--spread`` prints each cache's figures over the
first cache's: their median ratio (the common factor) and how far the figures stray from it.

The 64-cube fp32 matmul's per-process state (``--states N``): N fresh processes per variant, alternated,
each taking that one figure as its checkout's calibration does (its three layouts' warm trials, 8
interleaved rounds, ahead of the load), and how many land in each state (below or above STATE_SPLIT
TFLOPS): this checkout; this checkout on torch's threads only (no one-thread trial, as before v16); and
with ``--against DIR``, DIR's:

    .venv/bin/python benchmarks/bench_calibration.py --states 20 --against /tmp/base

For the integrator, at a quiet moment (nothing else running):

    .venv/bin/python benchmarks/bench_calibration.py --runs 3 --against /tmp/base
    .venv/bin/python benchmarks/bench_calibration.py --states 20 --against /tmp/base
"""
import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tunekit.measure.conditions_gomp import VARS  # noqa: E402 (tunekit imports no torch)

SETTINGS = {   # the Lab's tiny GPT at 4 x 64 tokens, as notebooks/18_expected plans it
    "cpu-tiny fp32": dict(precision="fp32"),
    "cpu-tiny fp32 + ckpt": dict(precision="fp32", checkpointing=True),
    "cpu-tiny bf16": dict(precision="bf16"),
}


def child() -> None:
    """Calibrate into $TUNEKIT_CACHE (empty), plan each setting, print one JSON line."""
    import tunekit
    from tunekit.measure.peaks import calibrate
    from tunekit.measure.stream import measure_stream

    trials, steal = recording(), StealSampler()
    t0 = time.perf_counter()
    stream = measure_stream()
    cals = {d: calibrate(d, "cpu") for d in ("fp32", "bf16")}
    took = time.perf_counter() - t0
    steal.stop()
    lab = tunekit.Lab(preset="cpu-tiny", device="cpu")
    steps = {k: lab.plan("cpu", micro_batch=4, seq_len=64, **kw).expected.step_s for k, kw in SETTINGS.items()}
    verdicts = {"stream": f"[{stream.priority}] {stream.conditions}",
                **{d: f"[{c.priority}] {c.conditions}" for d, c in cals.items()}}
    print(json.dumps(dict(steps=steps, verdicts=verdicts, seconds=took, policy=stream.wait_policy,
                          matmul64=stream.matmuls["fp32"][0][1], steal=steal.samples,
                          trials={str(k): v for k, v in trials.items()},
                          matmuls={d: [[n, tf] for n, tf in rows] for d, rows in stream.matmuls.items()})))


def recording() -> dict:
    """Keep every timed trial of this process's calibration (name -> [seconds, ...] in order): the
    stream record's interleaved figures and the MAMF sweep's tries ("mamf DTYPE N" per call)."""
    import dataclasses

    from tunekit.measure import peaks, stream, trials

    kept: dict = {}

    def interleaved(given, **kw):
        def counted(run):   # a second view: the process's CPU seconds over each trial's wall seconds
            def trial():
                c0, w0 = time.process_time(), time.perf_counter()
                t = run()
                cpu = kept.setdefault("cpu seconds", [0.0, 0.0])
                cpu[0], cpu[1] = cpu[0] + time.process_time() - c0, cpu[1] + time.perf_counter() - w0
                return t
            return trial
        return trials.interleaved({k: dataclasses.replace(t, run=counted(t.run)) for k, t in given.items()},
                                  times=kept, **kw)

    stream.interleaved = interleaved
    inner = peaks.time_repeats

    def time_repeats(fn, device=None, warmup=1, repeats=5, after_each=None):
        out = inner(fn, device, warmup, repeats, after_each)
        kept.setdefault(f"mamf call {len(kept)}", []).extend(out)
        return out

    peaks.time_repeats = time_repeats
    return kept


class StealSampler:
    """/proc/stat's steal and busy jiffies every half second in a thread (a read of one line, ~20 us)."""

    def __init__(self):
        import threading

        self.samples: list = []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        t0 = time.monotonic()
        while not self.done.wait(0.5):
            with open("/proc/stat") as f:
                v = [int(x) for x in f.readline().split()[1:]]
            self.samples.append((round(time.monotonic() - t0, 2), v[7], sum(v)))

    def stop(self):
        self.done.set()
        self.thread.join()


def record_child() -> None:
    """Calibrate into $TUNEKIT_CACHE (empty) and print its two cache files and what each took."""
    from tunekit.core import paths
    from tunekit.measure.peaks import calibrate
    from tunekit.measure.stream import measure_stream

    t0 = time.perf_counter()
    measure_stream()
    t1 = time.perf_counter()
    for d in ("fp32", "bf16"):
        calibrate(d, "cpu")
    seconds = dict(stream=t1 - t0, mamf=time.perf_counter() - t1)
    files = {f: (paths.cache_dir() / f).read_text() for f in ("stream.json", "mamf.json")}
    print(json.dumps(dict(files=files, seconds=seconds)))


STATE_SPLIT = 0.05   # TFLOPS between the 64-cube's two states on the 2-vCPU VM (0.031-0.034, 0.066-0.075)


def mm64_child() -> None:
    """The 64-cube fp32 matmul figure as this checkout's calibration takes it; one JSON line."""
    import torch

    from tunekit.measure import step_compute
    from tunekit.measure.trials import Trial, built, interleaved

    if os.environ.get("BENCH_THREADS_ONLY") and hasattr(step_compute, "or_one_thread"):
        step_compute.or_one_thread = lambda trial: trial   # as before v16: torch's threads only
    trials = {i: Trial(t, warm=True) for i, t in enumerate(built(step_compute._matmul_trials, 64, torch.float32))}
    best = interleaved(trials, least=8, most=8)
    print(json.dumps(dict(tflops=2 * 64**3 * 3 / sum(best.values()) / 1e12)))


def show_states(n: int, against: str | None) -> None:
    """--states N: how many of N fresh processes per variant land in each 64-cube state."""
    variants = [("this checkout", ROOT, {}), ("this checkout, torch's threads only", ROOT, {"BENCH_THREADS_ONLY": "1"})]
    if against:
        variants.append((f"@{against}", Path(against).resolve(), {}))
    got: dict = {name: [] for name, _, _ in variants}
    for i in range(n):
        for name, root, extra in (variants if i % 2 == 0 else variants[::-1]):
            env = dict(os.environ, PYTHONPATH=str(root), **extra)
            cmd = [sys.executable, str(ROOT / "benchmarks" / "bench_calibration.py"), "--mm64"]
            got[name].append(json.loads(subprocess.run(cmd, env=env, capture_output=True, text=True,
                                                       check=True).stdout.strip().splitlines()[-1])["tflops"])
        print(f"process {i + 1}: " + ", ".join(f"{k} {v[-1]:.3f}" for k, v in got.items()), flush=True)
    print(f"\n{'variant':<40}{'slow':>6}{'fast':>6}   TFLOPS (slow: under {STATE_SPLIT})")
    for name, v in got.items():
        slow = sum(x < STATE_SPLIT for x in v)
        print(f"{name:<40}{slow:>6}{len(v) - slow:>6}   {min(v):.3f}-{max(v):.3f}")


def fresh_record() -> dict:
    with tempfile.TemporaryDirectory(prefix="tunekit-cal-") as folder:   # removed after, Ctrl-C too
        env = dict(os.environ, TUNEKIT_CACHE=folder, PYTHONPATH=str(ROOT))
        out = subprocess.run([sys.executable, __file__, "--record"], env=env, capture_output=True, text=True,
                             check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def planned(files: dict, settings=SETTINGS) -> dict:
    """Each setting's (expected step, {op category: seconds}) from these cache files (a new
    folder as $TUNEKIT_CACHE: nothing is measured, every figure is read from them)."""
    import tunekit

    out = {}
    with tempfile.TemporaryDirectory(prefix="tunekit-spread-") as folder:   # removed after, Ctrl-C too
        for name, text in files.items():
            (Path(folder) / name).write_text(text)
        os.environ["TUNEKIT_CACHE"] = folder
        lab = tunekit.Lab(preset="cpu-tiny", device="cpu")
        for k, kw in settings.items():
            e = lab.plan("cpu", micro_batch=4, seq_len=64, **kw).expected
            cats = {}
            for row in e.rows:
                cats[row[1]] = cats.get(row[1], 0.0) + row[3]
            out[k] = (e.step_s, cats)
    return out


def with_group(base: dict, other: dict, group: str) -> dict:
    """``base``'s cache files with one figure group of ``other``'s: a stream record's field, or the
    whole MAMF cache ("mamf")."""
    if group == "mamf":
        return {**base, "mamf.json": other["mamf.json"]}
    b, o = json.loads(base["stream.json"]), json.loads(other["stream.json"])
    (key,) = b   # one entry: this machine's
    b[key][group] = o[key][group]
    return {**base, "stream.json": json.dumps(b)}


GROUPS = ("sweep", "cold", "warm", "op_s", "view_s", "module_s", "checkpoint_s", "gelu", "attention", "matmuls",
          "shapes", "mamf")


def mamf_figures(text: str) -> dict:
    """The MAMF cache as named numbers: each dtype's peak and its best TFLOPS at each size."""
    out = {}
    for c in json.loads(text).values():
        out[f"mamf {c['dtype']}"] = c["tflops"]
        for m, _, _, tf in c["sweep"]:
            name = f"mamf {c['dtype']} {m}"
            out[name] = max(out.get(name, 0.0), tf)
    return out


def show_spread(n: int) -> None:
    """--spread N: which figures vary between N fresh calibrations, and what each does to the step."""
    from tunekit.measure.stream import figures
    from tunekit.measure.trials import spread, spreads

    records = []
    for i in range(n):
        records.append(fresh_record())
        s = records[-1]["seconds"]
        print(f"cache {i + 1}: stream {s['stream']:.1f} s, MAMF {s['mamf']:.1f} s "
              f"at {time.strftime('%H:%M:%S UTC', time.gmtime())}", flush=True)
    files = [r["files"] for r in records]
    figs = [{**figures(next(iter(json.loads(f["stream.json"]).values()))), **mamf_figures(f["mamf.json"])}
            for f in files]
    ratio = spreads(figs)
    plans = [planned(f) for f in files]
    first = next(iter(SETTINGS))
    print(f"\n{'figure':<26}{'min':>12}{'max':>12}{'max/min':>9}")
    for k, r in ratio.items():
        vals = [f[k] for f in figs]
        print(f"{k:<26}{min(vals):>12.4g}{max(vals):>12.4g}{r:>9.3f}{'  <-' if r > 1.05 else ''}")
    common_factor(figs)
    print(f"\n{first!r}'s expected step with one figure group from each cache, the rest from cache 1:")
    print(f"{'group':<16}{'min ms':>9}{'max ms':>9}{'max/min':>9}")
    for g in GROUPS:
        steps = [plans[0][first][0]] + [planned(with_group(files[0], f, g), {first: SETTINGS[first]})[first][0]
                                        for f in files[1:]]
        print(f"{g:<16}{min(steps) * 1e3:>9.2f}{max(steps) * 1e3:>9.2f}{spread(steps):>9.3f}")
    for k in SETTINGS:
        print(f"\n{k!r} by op category over the {n} caches as they are:")
        print(f"{'category':<16}{'min ms':>9}{'max ms':>9}{'max/min':>9}")
        cats = list(plans[0][k][1]) + ["step"]
        for c in cats:
            v = [p[k][0] if c == "step" else p[k][1].get(c, 0.0) for p in plans]
            print(f"{c:<16}{min(v) * 1e3:>9.2f}{max(v) * 1e3:>9.2f}{spread(v):>9.3f}")


def common_factor(figs: list) -> None:
    """Each cache's figures over cache 1's (a rate's ratio, a time's inverse: above 1 is faster): their
    median (what one factor, the host's speed then, would move every figure by), how many lie within 5%
    of it, and the three farthest from it."""
    import statistics

    print("\neach cache's figures over cache 1's, as speeds (a time's ratio inverted):")
    for i, f in enumerate(figs[1:], 2):
        r = {k: (f[k] / figs[0][k]) ** (-1 if k.endswith("_s") or "_s " in k else 1)
             for k in f if k in figs[0] and figs[0][k] > 0 and f[k] > 0}
        m = statistics.median(r.values())
        off = sorted(r, key=lambda k: -abs(r[k] / m - 1))
        near = sum(abs(v / m - 1) <= 0.05 for v in r.values())
        print(f"cache {i}: median {m:.3f}; {near} of {len(r)} figures within 5% of it; farthest: "
              + ", ".join(f"{k} {r[k]:.3f}" for k in off[:3]))


def policy_env(chosen: str | None) -> dict:
    """The environment of a child calibrating under ``chosen`` (``"default"``: neither variable set;
    ``"NAME=VALUE ..."``; None: this process's environment)."""
    env = dict(os.environ)
    if chosen is not None:
        for k in VARS:
            env.pop(k, None)
        env.update(kv.split("=", 1) for kv in chosen.split() if kv != "default")
    return env


def calibrated(load: bool, chosen: str | None = None, root: Path = ROOT) -> dict:
    """A fresh cache calibrated in a child running ``root``'s checkout (its own bench's ``--child``)."""
    cmd = [sys.executable, str(root / "benchmarks" / "bench_calibration.py"), "--child"]
    sys.path.insert(0, str(ROOT / "tools"))
    from busy import busy

    # the cache folder is removed after, on Ctrl-C too; so is the load (busy's own clean-up)
    with tempfile.TemporaryDirectory(prefix="tunekit-cal-") as folder, \
            busy(cores=2, seconds=1800, log=lambda line: None) if load else contextlib.nullcontext():
        env = dict(policy_env(chosen), TUNEKIT_CACHE=folder, PYTHONPATH=str(root))
        done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode != 0:   # say why, not only that it failed
        raise SystemExit(f"a calibrating child of {root} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--record", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--mm64", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--states", type=int, metavar="N", help="N fresh processes per variant: the 64-cube "
                    "fp32 matmul figure's state in each (with --against: DIR's code too)")
    ap.add_argument("--busy-first", action="store_true", help="calibrate beside the load first")
    ap.add_argument("--runs", type=int, default=1, metavar="R", help="R pairs, alternating which goes first")
    ap.add_argument("--policy", action="append", metavar="P", help="libgomp wait policy of the children: "
                    "'default' or 'NAME=VALUE' (repeat to compare; default: the shell's environment)")
    ap.add_argument("--against", metavar="DIR", help="another checkout (the code before a change): "
                    "each run does its pair too, alternated with this checkout's")
    ap.add_argument("--spread", type=int, metavar="N", help="N fresh caches in a row, as the machine is: "
                    "which figures vary, and how far each moves the expected step")
    args = ap.parse_args()
    if args.child:
        return child()
    if args.record:
        return record_child()
    if args.mm64:
        return mm64_child()
    if args.spread:
        return show_spread(args.spread)
    if args.states:
        return show_states(args.states, args.against)
    roots = [ROOT] + ([Path(args.against).resolve()] if args.against else [])
    variants = [(chosen, root) for root in roots for chosen in (args.policy or [None])]
    every: dict = {}
    for run in range(args.runs):
        busy_first = args.busy_first != (run % 2 == 1)   # alternate which goes first
        for chosen, root in (variants if run % 2 == 0 else variants[::-1]):   # and which policy, checkout
            got = {}
            for load in ((True, False) if busy_first else (False, True)):
                got[load] = calibrated(load, chosen, root)
                where = 'beside busy.py --cores 2' if load else 'as the machine is'
                label = f"{got[load]['policy']}{'' if root == ROOT else ' @' + str(root)}"
                print(f"run {run + 1} [{label}] {where:<26} "
                      f"calibrated in {got[load]['seconds']:.0f} s at {time.strftime('%H:%M UTC', time.gmtime())}; "
                      f"64-cube fp32 matmul {got[load]['matmul64']:.3f} TFLOPS", flush=True)
                for what, v in got[load]["verdicts"].items():
                    print(f"  {what:<7} {v}")
                for d, rows in got[load].get("matmuls", {}).items():   # a checkout before this line: none
                    print(f"  {d} matmul TFLOPS by cube: " + ", ".join(f"{n} {tf:.3f}" for n, tf in rows))
            print(f"\n{'expected step':<24}{'as is ms':>10}{'busy ms':>10}{'busy/as is':>12}")
            for k in SETTINGS:
                a, b = got[False]["steps"][k], got[True]["steps"][k]
                print(f"{k:<24}{a * 1e3:>10.2f}{b * 1e3:>10.2f}{b / a:>12.3f}")
            trial_profile(got)
            mine = every.setdefault(label, {"caches": [], "pairs": [], "seconds": []})
            mine["caches"] += [got[False]["steps"], got[True]["steps"]]
            mine["seconds"] += [got[False]["seconds"], got[True]["seconds"]]
            mine["pairs"].append(got[True]["steps"][next(iter(SETTINGS))] / got[False]["steps"][next(iter(SETTINGS))])
            print()
    for label, mine in every.items():
        summary(label, mine)


def trial_profile(got: dict) -> None:
    """A pair's every timed trial against the pair's fastest of it (the two caches' together): per
    interleaved round, the median over the figures of each cache's round-fastest over that; each
    cache's figures at their fastest over it (median, worst), the MAMF tries likewise, and the
    hypervisor's steal over the calibration (/proc/stat). A cache slow in every round had a slow
    host throughout; one slow in most rounds with a few near 1.00 had its fast moments found."""
    import statistics

    if not all("trials" in g for g in got.values()):   # a checkout before this line keeps none
        return
    cpu = {load: got[load]["trials"].pop("cpu seconds", [float("nan"), 1.0]) for load in got}
    names = [k for k in got[False]["trials"] if k in got[True]["trials"]]
    ref = {k: min(min(got[load]["trials"][k]) for load in got) for k in names}
    stream_names = [k for k in names if not k.startswith("mamf")]
    for load in (False, True):
        times = got[load]["trials"]
        rounds = min(len(times[k]) for k in stream_names)
        per_round = []
        for r in range(rounds):
            ratios = []
            for k in stream_names:
                chunk = len(times[k]) // rounds
                ratios.append(min(times[k][r * chunk:(r + 1) * chunk]) / ref[k])
            per_round.append(statistics.median(ratios))
        best = [min(times[k]) / ref[k] for k in stream_names]
        mamf = [min(times[k]) / ref[k] for k in names if k.startswith("mamf")]
        s = got[load]["steal"]
        steal = (s[-1][1] - s[0][1]) / max(1, s[-1][2] - s[0][2]) if len(s) > 1 else float("nan")
        print(f"  {'busy' if load else 'as is'}: rounds' median trial / pair's fastest: "
              + " ".join(f"{x:.2f}" for x in per_round)
              + f"; figures at their fastest: median {statistics.median(best):.3f}, worst {max(best):.2f}, "
              f"{sum(b <= 1.05 for b in best)} of {len(best)} within 5%; MAMF tries median "
              f"{statistics.median(mamf) if mamf else float('nan'):.3f}; steal {steal:.1%}; "
              f"CPU s per trial s {cpu[load][0] / cpu[load][1]:.2f}")


def summary(label: str, mine: dict) -> None:
    """One checkout and policy's pairs, its caches' spread of each setting's step, and of each
    setting's step over the first setting's (what a constant factor between caches leaves equal)."""
    from tunekit.measure.trials import spread

    first = next(iter(SETTINGS))
    caches, secs = mine["caches"], mine["seconds"]
    print(f"[{label}] {len(mine['pairs'])} pair(s), busy/as is of {first!r}: "
          + " ".join(f"{r:.3f}" for r in mine["pairs"]))
    print(f"[{label}] calibration seconds (stream + MAMF), as is and busy in turn: "
          + " ".join(f"{x:.0f}" for x in secs))
    print(f"[{label}] all {len(caches)} caches (busy and as is): expected step max/min")
    for k in SETTINGS:
        v = [c[k] for c in caches]
        print(f"{k:<24}{min(v) * 1e3:>10.2f}{max(v) * 1e3:>10.2f}{spread(v):>12.3f}")
    print(f"[{label}] each setting's step over {first!r}'s, per cache: max/min over the {len(caches)} caches")
    for k in list(SETTINGS)[1:]:
        v = [c[k] / c[first] for c in caches]
        print(f"{k + ' / fp32':<24}{min(v):>10.3f}{max(v):>10.3f}{spread(v):>12.3f}")


if __name__ == "__main__":
    main()
