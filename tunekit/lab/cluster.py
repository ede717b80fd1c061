"""A ``lab.run(..., on=tunekit.Slurm(...))``: the Lab's model, weights and toggles sent to a cluster
job (tunekit.parallel.slurm), and the job's RunResult in the Lab's log, where it ran said.

    >>> result = run_on(lab, tunekit.Slurm(partition="gpu", gpus_per_node=8), 20, 2, None,
    ...                 lab.setting_of(setting=tunekit.Setting(parallel="fsdp")))

Everything a local distributed run refuses is refused here too, and what the cluster cannot take
(no sbatch, an unknown partition, more nodes or GPUs than it has, a time limit shorter than the
run) before anything is submitted. The job's folder (spec, weights, script, progress, result,
logs) stays for the record. A job that ends without a result is a failed run in the log, its
cause in words and the steps it measured kept, and the JobFailed goes on to the caller.

``lab.autotune(..., on=target)``: `ClusterTrials`, below.
"""
from __future__ import annotations

import statistics
import subprocess
import time

import torch

from tunekit.autotune.run import LabTrials
from tunekit.autotune.search import TrialFailed
from tunekit.core.results import RunResult
from tunekit.core.setting import Setting
from tunekit.core.toggles import ToggleError, label, normalized
from tunekit.core.units import is_missing
from tunekit.lab import fit
from tunekit.lab.distributed import problems, recheck_rates


def submitted(lab, target, steps, warmup, progress, s: Setting, verbose, local_layout, wait=True):
    """``lab.run(on=target)``'s checks and display, then `run_on`: the job's state shown as it
    changes, Ctrl-C cancels it. ``s``: the call's one Setting (`lab.setting_of`: its toggles and
    ``parallel``; the ranks are the target's). ``local_layout``: the call's (trace, memory, link, nproc, nodes),
    which a cluster run takes from its target or cannot do. ``wait=False``: the job submitted and
    followed by a thread; a `ClusterRun` returned at once (tunekit.lab.cluster_run)."""
    from tunekit.core.validate import flag

    trace, memory, link, nproc, nodes = local_layout
    if trace or memory or link is not None or nproc != 1 or nodes != 1:
        raise ToggleError(["on=... takes its layout from the target (nodes, gpus_per_node or "
                           "ntasks_per_node): leave nproc, nodes, link, trace and memory out"])
    if not hasattr(target, "submit"):
        raise ToggleError([f"on= is a cluster target such as tunekit.Slurm(partition=...), got {target!r}"])
    if not flag("wait", wait):
        from tunekit.lab.cluster_run import ClusterRun

        if progress is not None:
            raise ToggleError(["progress= is called as a waited run's steps go: with wait=False, read "
                               "handle.steps_done (or leave wait=True)"])
        job, sent = submit_run(lab, target, steps, warmup, s, expect=True)
        return ClusterRun(lab, job, sent, record, verbose=flag("verbose", verbose))
    if not flag("verbose", verbose):
        return run_on(lab, target, steps, warmup, progress, s)
    from tunekit.view.progress import RunProgress

    with RunProgress(steps, progress) as shown:
        shown.result = run_on(lab, target, steps, warmup, shown.tick, s)
    return shown.result


def run_on(lab, target, steps, warmup, progress, s: Setting, on_state=None) -> RunResult:
    """``lab.run(on=target)`` (see its docstring): ``target.nodes`` x its ranks per node, each from
    the Lab's weights; ``on_state(state, info)`` on each change of the job's state (default: one
    line per change, printed)."""
    from tunekit.parallel.slurm import JobFailed

    job, sent = submit_run(lab, target, steps, warmup, s, expect=True)
    try:
        result = job.wait(progress=progress, on_state=on_state or _say)
    except JobFailed as e:
        record(lab, job, sent, e)
        raise
    return record(lab, job, sent, result)


def submit_run(lab, target, steps, warmup, s: Setting, name: str = "tunekit-run", expect: bool = False):
    """`run_on`'s checks (a ToggleError, nothing submitted) and its job submitted: (the SlurmJob,
    what `record` needs). ``s``: the run's Setting, complete (its toggles, ``parallel``; the ranks
    are the target's). An autotune sweep on a cluster submits its trials this way, several at once.
    ``expect``: the target's time limit checked against the run's expected time (`expected_run`)."""
    from tunekit.models.spec import factory_spec, model_spec
    from tunekit.parallel.slurm import job_folder

    nproc, nodes = target.ranks_per_node, target.nodes
    t, parallel = s.toggles, s.parallel
    if nproc * nodes == 1 and parallel is None:
        errors = lab.check(t, steps, warmup)
    else:
        errors = problems(lab, t, steps, warmup, parallel, nproc, nodes)
    try:
        spec_model = factory_spec(lab.factory) if lab.factory else model_spec(lab.model)
    except ValueError as e:
        errors.insert(0, str(e))
    device = "cuda" if target.gpus_per_node else "cpu"
    expected = expected_run(lab, target, normalized(t), steps, warmup, parallel, nproc * nodes) \
        if expect and not errors else None
    errors += target.check(*expected or (None,))
    if errors:
        raise ToggleError(errors)
    t = normalized(t)
    if parallel is not None:
        fit.check_distributed(lab, t, parallel, nproc, nodes)  # before anything is submitted
    lab.log.check_writable()
    dtype = t.compute_on(lab.device.type)
    peak = lab.peaks[dtype]
    folder = job_folder(target, name.removeprefix("tunekit-"))
    torch.save(getattr(lab.model, "_orig_mod", lab.model).state_dict(), folder / "weights.pt")
    spec = {"model": spec_model, "parallel": parallel, "toggles": t.asdict(), "steps": int(steps),
            "warmup": int(warmup), "seed": lab.seed, "data": lab.data, "weights": str(folder / "weights.pt"),
            "peak_tflops": peak.tflops, "peak_tflops_source": peak.source, "peak_kind": peak.kind,
            "device": device, **({"blocks": lab.blocks} if lab.blocks else {})}
    where = f"{parallel + ' ' if parallel else ''}{nodes}x{nproc}"
    job = target.submit(spec, folder, name=name)
    return job, {"toggles": t, "where": where, "spec": spec, "dtype": dtype, "peak": peak,
                 "world_size": nproc * nodes, "parallel": parallel, "nodes": nodes}


def expected_run(lab, target, t, steps, warmup, parallel, world_size) -> tuple[float, str] | None:
    """How long the run's steps are expected to take, and on what figure: (seconds, words) or None
    (nothing to expect from). It refuses a time limit, so it must not guess high: the step of the
    last run measured on this setting (its toggles, parallel and world size) on the target's
    partition; for a CPU job from a CPU Lab, else the last such run here, else the Lab's plan of it
    (``lab.plan``: a speed-of-light bound, so a limit it finds too short is too short). A GPU job
    takes no figure of this machine's GPU, which may be slower than the cluster's.
    ``(warmup + steps)`` steps: the warm-up ones take a step's time too."""
    n, cpu = int(steps) + int(warmup), not target.gpus_per_node and lab.device.type == "cpu"
    same = [r for r in lab.log.runs if r.status == "ok" and r.toggles == t and r.parallel == parallel
            and (r.world_size or 1) == world_size and not is_missing(r.step_s) and r.step_s > 0
            and str(getattr(r, "device", "") or "").startswith("cpu") == (not target.gpus_per_node)]
    there = [r for r in same if (r.job or {}).get("engine") == "slurm"
             and (target.partition is None or r.job.get("partition") == target.partition)]
    r = there[-1] if there else same[-1] if cpu and same else None
    if r is not None:
        where = f"on partition {r.job['partition']}" if there else "here"
        return n * r.step_s, f"{n} steps x {r.step_s:.3g} s, the step of run #{r.run_id} on this setting {where}"
    if not cpu:
        return None
    try:
        layout = {"parallel": parallel, "world_size": world_size} if parallel else {}
        plan = lab.plan("cpu", verbose=False, **layout, **t.asdict())
    except Exception:  # noqa: BLE001 - no plan, no expectation: Slurm's limit alone holds the job
        return None
    if plan.expected is None or not plan.expected.step_s:
        return None
    step = plan.expected.step_s
    return n * step, f"{n} steps x {step:.3g} s, the plan's expected step (lab.plan)"


def record(lab, job, sent: dict, outcome) -> RunResult:
    """The end of a job `submit_run` sent, in the Lab's log: its RunResult (returned), or, for a
    JobFailed ``outcome``, a failed run with the cause and the steps measured so far (returned too;
    the caller raises)."""
    from tunekit.parallel.slurm import JobFailed

    t, where, steps = sent["toggles"], sent["where"], sent["spec"]["steps"]
    if isinstance(outcome, JobFailed):
        times = outcome.step_s
        fields = {"job": outcome.job, "world_size": sent["world_size"], "parallel": sent["parallel"],
                  "nodes": sent["nodes"]}
        if times:   # the steps measured before the end, kept
            fields.update(step_s=statistics.fmean(times), step_s_min=min(times), step_s_max=max(times))
        result = RunResult.failed(t, f"{where} {label(t, lab.resolve())} (slurm job {job.job_id})", outcome.cause,
                                  [f"{len(times)} of {steps} timed steps measured before the job ended"], **fields)
    else:
        result = outcome
        result.label = f"{where} {label(t, lab.resolve())}"
        if lab.device.type == sent["spec"]["device"]:   # the Lab's own kind of device: its peak re-checked
            recheck_rates(lab, result, sent["peak"], sent["dtype"])
    result.explainer = job_explainer(lab, result)   # tunekit.explain(result): the job's step against the plan
    return lab.log.add(result)


def job_explainer(lab, run):
    """``RunResult.explainer`` of a cluster run: () -> its whole step against ``lab.plan`` of its
    setting and layout on its device (`tunekit.core.explain.explain_step`: a job is not traced),
    where it ran said (the job, its nodes, each rank's node and CPUs). The Lab is held weakly."""
    import weakref

    ref = weakref.ref(lab)

    def explain_run():
        from tunekit.core.explain import explain_step, job_words
        from tunekit.lab.explain import plan_device

        lab = ref()
        if lab is None:
            raise ValueError("the Lab that ran this run is gone, and with it the model to plan: "
                             "tunekit.explain(run, tunekit.plan(model, device, ...)) takes the plan")
        layout = {"parallel": run.parallel, "world_size": run.world_size, "nodes": run.nodes} if run.parallel else {}
        plan = lab.plan(plan_device(run.device), verbose=False, **layout, **run.toggles.asdict())
        return explain_step(plan.expected, step_s=run.step_s, label=f"run #{run.run_id} ({run.label})",
                            conditions=run.conditions, where=job_words(run.job))
    return explain_run


def _say(state: str, info: dict) -> None:
    """One line per change of the job's state: pending with its reason, running on its nodes."""
    waits_on = info.get("Reason")   # Slurm's word for what a pending job waits for ("None": nothing)
    said = {"PENDING": f"pending ({waits_on})" if waits_on not in (None, "None") else "pending",
            "RUNNING": f"running on {info.get('NodeList')}"}.get(state, state.lower())
    job = info.get("JobId", "?")
    print(f"slurm job {job}: {said}", flush=True)   # output, not a warning: a notebook shows it plainly


# --- lab.autotune(on=target): the search's trials as jobs ------------------------------------------

class ClusterTrials(LabTrials):
    """``lab.autotune(..., on=tunekit.Slurm(...))``: `LabTrials` whose trials are jobs on ``target``.

        >>> found = lab.autotune(budget_s=600, on=tunekit.Slurm(partition="gpu", gpus_per_node=1, max_jobs=4))

    The search is the Lab's (tunekit.autotune.run): the same stages, races, noise band, busy
    retries, tiebreak and verdicts, the same AutotuneResult. It is sequential by nature (a stage
    starts from the winner of the one before, a race's next round from the last round's scores), so
    what runs at once are the independent trials of one step of it: every candidate of a race's
    round, the pair a close call settles, a tiebreak round (``Search.measure_all`` calls
    ``measure_many``). Each trial is one job (`submit_run`: the Lab's weights and toggles, the layout
    from the target), at most ``target.max_jobs`` in the queue at once, the next submitted as one
    ends. Each job's result is in the Lab's log with ``result.job``; a job that ends without a
    result is a failed run in the log and a failed trial (its cause in words), and the search goes
    on. Ctrl-C cancels every job of the sweep still queued or running (squeue shows none of them
    afterwards), then the search ends as it does locally (``lab.last_autotune``).

    Jobs that share a node are measured busy (``SlurmJob.shared_with``), so their figures decide
    nothing: keep ``exclusive=True`` (the default) and a partition with ``max_jobs`` free nodes for
    the jobs to run side by side. The micro-batch stage's max-batch search runs on the Lab itself
    when the jobs run on its kind of device (CPU jobs, a CPU Lab); for GPU jobs every micro-batch up
    to ``max_micro_batch`` is tried as a job, and one that does not fit is a failed trial.

    ``jobs``: every job of the sweep, in the order submitted; ``spans``: (job id, submitted,
    ended) on ``clock``; ``overhead_s``: the least a trial cost besides its steps so far (queue,
    start, the ranks' imports), which the search's budget check adds to each trial it predicts."""

    def __init__(self, lab, target, warmup: int, memory_budget_bytes=None, budget_s: float | None = None,
                 poll_s: float = 0.5):
        number = isinstance(budget_s, (int, float)) and not isinstance(budget_s, bool)
        super().__init__(lab, warmup, memory_budget_bytes, budget_s if number else None)  # a bad one: refused later
        self.target, self.poll_s = target, poll_s
        self.jobs: list = []
        self.spans: list[tuple[str, float, float]] = []
        self.overhead_s = 0.0
        self._overheads: list[float] = []

    def measure(self, t, steps: int):
        (outcome, _), = self.measure_many([(t, steps)])
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    def max_batch(self, t, limit: int) -> int | None:
        if not self.target.gpus_per_node and self.lab.device.type == "cpu":
            return super().max_batch(t, limit)   # the jobs' kind of device: the Lab's search holds
        self.last_search = None
        return limit   # every micro-batch up to the limit is tried as a job; one that does not fit fails

    def measure_many(self, trials: list) -> list[tuple]:
        """Each ``(toggles, steps)`` as one job, at most ``target.max_jobs`` queued at once;
        returns ``(RunResult or the exception, seconds from submission to end)`` for each, in order."""
        from tunekit.parallel.slurm_job import ENDED

        out: list = [None] * len(trials)
        waiting = list(enumerate(trials))
        live: dict[int, tuple] = {}   # index -> (job, what record needs, submitted at, seen by Slurm)
        try:
            while waiting or live:
                while waiting and len(live) < self.target.max_jobs:
                    i, (t, steps) = waiting.pop(0)
                    t0 = self.clock()
                    try:
                        job, sent = submit_run(self.lab, self.target, steps, self.warmup, Setting.of(t),
                                               name="tunekit-autotune")
                    except Exception as e:  # noqa: BLE001 - refused (ToggleError) or sbatch said no: this trial's
                        out[i] = (e, self.clock() - t0)
                        continue
                    self.jobs.append(job)
                    live[i] = [job, sent, t0, False]
                for i, entry in list(live.items()):
                    job, sent, t0, seen = entry
                    info = job.info()
                    state = info.get("JobState", "UNKNOWN")
                    entry[3] = seen or bool(info)
                    if state == "RUNNING":
                        job._note_neighbours(info)
                    limit = self.target.start_timeout_s
                    never = state == "PENDING" and limit is not None and self.clock() - t0 > limit
                    if never or state in ENDED or (not info and seen):
                        del live[i]
                        outcome = self._never(job, sent, info) if never else self._ended(job, sent, info)
                        took = self.clock() - t0
                        out[i] = (outcome, took)
                        self.spans.append((job.job_id, t0, self.clock()))
                        if not isinstance(outcome, BaseException):
                            self._overheads.append(max(took - (outcome.steps + outcome.warmup) * outcome.step_s, 0.0))
                            self.overhead_s = min(self._overheads)
                if live:
                    time.sleep(self.poll_s)
        except KeyboardInterrupt:
            cancel_all([entry[0] for entry in live.values()])
            raise
        return out

    def _never(self, job, sent, info):
        """A job pending past ``target.start_timeout_s``: cancelled, a failed run and trial (as `SlurmJob.wait`)."""
        from tunekit.parallel.slurm import JobFailed

        job.cancel()
        e = JobFailed(f"the job never started: pending ({info.get('Reason', '?')}) for "
                      f"{self.target.start_timeout_s:.0f} s, then cancelled", job._job(info), [])
        record(self.lab, job, sent, e)
        return TrialFailed(f"slurm job {job.job_id}: {e.cause}")

    def _ended(self, job, sent, info):
        from tunekit.parallel.slurm import JobFailed

        try:
            result = job._finish(info)
        except JobFailed as e:
            record(self.lab, job, sent, e)
            return TrialFailed(f"slurm job {job.job_id}: {e.cause}")
        result = record(self.lab, job, sent, result)
        return result


def cancel_all(jobs: list, wait_s: float = 30.0) -> None:
    """scancel every job at once, then wait until squeue lists none of them."""
    if not jobs:
        return
    subprocess.run(["scancel", *[j.job_id for j in jobs]], capture_output=True, text=True, timeout=30)
    for job in jobs:
        job.cancel(wait_s)
