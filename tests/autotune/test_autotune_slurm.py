"""``lab.autotune(..., on=Slurm(...))`` on a real Slurm cluster (tools/slurm_cluster.py): each trial is a
job, at most ``max_jobs`` queued at once, the same AutotuneResult and the trials in the Lab's log with
their job; a failed job is a failed trial; Ctrl-C cancels every job of the sweep. Each job here costs
10-40 s (a torch import per rank), so the sweeps are two or three trials of a few steps."""
import _thread
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tunekit.autotune import AutotuneResult, autotune
from tunekit.core.conditions import Conditions
from tunekit.parallel.slurm import Slurm

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
import slurm_cluster  # noqa: E402

needs_cluster = pytest.mark.skipif(slurm_cluster.missing() is not None,
                                   reason=f"no test cluster here: {slurm_cluster.missing()}")
# only the micro-batch stage has more than one value: its candidates are the trials
FIXED = {"precision": ["fp32"], "attention": ["sdpa"], "optimizer": ["adamw"], "checkpointing": [False],
         "compile": [False]}


SEQ = 32
SPEED = {1: 500.0, 2: 700.0, 4: 850.0, 8: 1000.0}   # tokens/s by micro-batch: 8 is the fastest


class Trials:
    """Measurements from SPEED, one second a trial on a fake clock; with ``batched`` it also has
    ``measure_many`` (as a cluster's trials do): a batch costs one second, its trials side by side."""

    def __init__(self, batched: bool):
        self.now, self.measured, self.batches = 0.0, [], []
        if batched:
            self.measure_many = self._many

    def clock(self):
        return self.now

    def _run(self, t):
        self.measured.append(t.micro_batch)
        tokens = t.micro_batch * SEQ
        from types import SimpleNamespace
        return SimpleNamespace(tokens_per_step=tokens, step_s_min=tokens / SPEED[t.micro_batch], steps=3,
                               warmup=0, step_s=1 / 3, conditions=Conditions("quiet", "nothing else ran"),
                               peak_mem_bytes=1000.0, run_id=len(self.measured))

    def measure(self, t, steps):
        self.now += 1.0
        return self._run(t)

    def _many(self, trials):
        self.now += 1.0
        self.batches.append(sorted(t.micro_batch for t, _ in trials))
        return [(self._run(t), 1.0) for t, _ in trials]

    def max_batch(self, t, limit):
        return limit


def test_a_round_s_trials_go_together_and_the_search_is_the_same(tmp_path):
    from tunekit.lab.lab import Lab

    lab = Lab(log_path=tmp_path / "runs.jsonl")   # cpu-tiny, micro-batch 8
    found = {}
    for batched in (False, True):
        trials = Trials(batched)
        r = autotune(lab, budget_s=1000, repeats=2, max_micro_batch=8, space={**FIXED, "micro_batch": [1, 2, 4, 8]},
                     trials=trials)
        found[batched] = (r.toggles.micro_batch, r.status, sorted(trials.measured), trials)
    one, many = found[False], found[True]
    assert one[:3] == many[:3] and one[0] == 8      # the same winner from the same trials
    # rounds 1 and 2 of the micro-batch race: the 4 candidates at once, twice; 8 beats each other
    # beyond the 3% band (850/1000 is the closest), so the final race (repeats 2+2) and the tiebreak
    # have nothing to settle
    assert many[3].batches == [[1, 2, 4, 8], [1, 2, 4, 8]] and one[2] == [1, 1, 2, 2, 4, 4, 8, 8]
    assert (one[3].now, many[3].now) == (8.0, 2.0)   # 8 trials of one second; 2 batches of one second


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    folder = tmp_path_factory.mktemp("slurm")
    with slurm_cluster.cluster(folder, cpus=4) as env:
        old = os.environ.get("SLURM_CONF")
        os.environ.update(env)
        yield folder
        if old is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = old


def _ours() -> list[str]:
    return subprocess.run(["squeue", "-h", "-n", "tunekit-autotune", "-o", "%i"],
                          capture_output=True, text=True).stdout.split()


class QueueWatch(threading.Thread):
    """Samples squeue every 0.2 s: the most jobs of the sweep queued (pending or running) at once."""

    def __init__(self, then=None):
        super().__init__(daemon=True)
        self.most, self.then, self.done = 0, then, threading.Event()

    def run(self):
        while not self.done.is_set():
            n = len(_ours())
            self.most = max(self.most, n)
            if self.then is not None and n >= 2:
                self.then()
                self.then = None
            time.sleep(0.2)


def _lab(tmp_path):
    import tunekit

    lab = tunekit.Lab(preset="cpu-tiny", device="cpu", log_path=tmp_path / "runs.jsonl")
    lab.defaults = lab.resolve(micro_batch=2, seq_len=32)
    return lab


@needs_cluster
@pytest.mark.parametrize("on,words", [
    (Slurm(partition="gpuq"), "no partition 'gpuq' on this cluster; it has ['debug']"),
    ("debug", "on= is a cluster target such as tunekit.Slurm(partition=...), got 'debug'."),
])
def test_bad_input_is_refused_before_any_job(cluster, tmp_path, on, words):
    from tunekit.core.toggles import ToggleError

    lab = _lab(tmp_path)
    with pytest.raises(ToggleError) as e:
        lab.autotune(budget_s="soon", space=FIXED, on=on, verbose=False)
    # every problem at once: the bad budget and what the cluster (or the option's check) says
    assert e.value.problems == ["budget_s must be a finite number > 0, got 'soon'", words]
    assert _ours() == [] and lab.log.runs == []


@pytest.mark.slow   # three jobs (fast: test_a_round_s_trials_go_together_and_the_search_is_the_same)
@needs_cluster
def test_a_sweep_on_the_cluster_keeps_max_jobs_queued_and_logs_every_trial(cluster, tmp_path):
    lab = _lab(tmp_path)
    # exclusive: one job at a time on the one node, the others pending; 3 candidates, max_jobs=2
    target = Slurm(time="5", max_jobs=2, folder=str(tmp_path / "jobs"))
    watch = QueueWatch()
    watch.start()
    try:
        found = lab.autotune(budget_s=20, steps=2, warmup=1, repeats=1, max_micro_batch=4,
                             space={**FIXED, "micro_batch": [1, 2, 4]}, on=target, verbose=False)
    finally:
        watch.done.set()
        watch.join()
    assert isinstance(found, AutotuneResult) and found.status == "complete"
    assert found.toggles is not None and found.toggles.micro_batch in (1, 2, 4)
    measured = {c.toggles.micro_batch: len(c.runs) for c in found.candidates if c.runs}
    # round 1 measures each once (repeats=1); how many more the 20 s budget allows depends on the machine
    assert sorted(measured) == [1, 2, 4] and min(measured.values()) >= 1
    runs = lab.log.runs   # every trial is a job, in the Lab's log with it
    assert len(runs) == sum(measured.values()) and all(r.status == "ok" and r.job["state"] == "COMPLETED"
                                                       for r in runs)
    assert all(r.job["folder"].startswith(str(tmp_path / "jobs")) for r in runs)
    assert watch.most == 2   # 3 trials, never more than max_jobs=2 in the queue, and 2 at once
    assert found.verdict and _ours() == []


@pytest.mark.slow   # two jobs
@needs_cluster
def test_a_trial_whose_job_fails_is_a_failed_trial_and_the_search_goes_on(cluster, tmp_path):
    lab = _lab(tmp_path)
    # a job of micro-batch 4 exits before its ranks start (its spec says so: the folder's spec.json)
    fail = ('d=$(scontrol show job -o "$SLURM_JOB_ID" | sed -n "s|.*StdOut=\\([^ ]*\\)/slurm-.*|\\1|p"); '
            'if grep -q \'"micro_batch": 4,\' "$d/spec.json"; then echo "no micro-batch 4 here" >&2; exit 3; fi')
    target = Slurm(time="5", max_jobs=2, folder=str(tmp_path / "jobs"), setup=(fail,))
    found = lab.autotune(budget_s=20, steps=2, warmup=1, repeats=1, max_micro_batch=4,
                         space={**FIXED, "micro_batch": [2, 4]}, on=target, verbose=False)
    four = next(c for c in found.candidates if c.toggles.micro_batch == 4)
    assert four.status == "failed" and four.why.startswith("slurm job ")
    assert "a rank exited with an error" in four.why and "no micro-batch 4 here" in four.why
    assert found.toggles.micro_batch == 2 and found.status == "complete"
    failed = [r for r in lab.log.runs if r.status == "failed"]
    assert len(failed) == 1 and failed[0].job["state"] == "FAILED"


@pytest.mark.slow   # two jobs
@needs_cluster
def test_ctrl_c_cancels_every_job_of_the_sweep(cluster, tmp_path):
    lab = _lab(tmp_path)
    target = Slurm(time="5", max_jobs=2, folder=str(tmp_path / "jobs"))
    watch = QueueWatch(then=_thread.interrupt_main)   # Ctrl-C once two jobs are queued
    watch.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            lab.autotune(budget_s=600, steps=10_000, warmup=1, repeats=1, max_micro_batch=4,
                         space={**FIXED, "micro_batch": [2, 4]}, on=target, verbose=False)
    finally:
        watch.done.set()
        watch.join()
    assert _ours() == []
    assert lab.last_autotune is not None and lab.last_autotune.status == "interrupted"


@pytest.mark.slow   # three jobs
@needs_cluster
def test_trials_that_never_start_are_failed_trials_and_cancelled(cluster, tmp_path):
    lab = _lab(tmp_path)
    # another job holds the one node: the sweep's jobs stay pending past start_timeout_s
    blocker = subprocess.run(["sbatch", "--parsable", "--exclusive", f"--output={tmp_path}/blocker.out",
                              "--wrap", "sleep 120"], capture_output=True, text=True, check=True).stdout.strip()
    try:
        target = Slurm(time="5", max_jobs=2, start_timeout_s=3, folder=str(tmp_path / "jobs"))
        found = lab.autotune(budget_s=60, steps=2, warmup=1, repeats=1, max_micro_batch=4,
                             space={**FIXED, "micro_batch": [2, 4]}, on=target, verbose=False)
    finally:
        subprocess.run(["scancel", blocker], check=True)
    tried = [c for c in found.candidates if c.toggles.micro_batch in (2, 4)]
    assert [c.status for c in tried] == ["failed", "failed"]
    assert all("the job never started: pending" in c.why and "for 3 s, then cancelled" in c.why for c in tried)
    assert [r.status for r in lab.log.runs] == ["failed", "failed"] and found.toggles is None
    assert _ours() == []
