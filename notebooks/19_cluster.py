# ---
# jupyter:
#   jupytext:
#     notebook_metadata_filter: -jupytext.text_representation.jupytext_version
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 19 · From notebook to cluster
#
# **Claim.** The step from "measured here" to "measured where the GPUs are" is one argument:
# `lab.run(..., on=tunekit.Slurm(...))` sends the Lab's model, weights and toggles to a Slurm job, and the
# same `RunResult` comes home to the same run log, with where it ran (job id, partition, nodes,
# state). What a job adds is its start: the queue, the scheduler and every rank's interpreter stand
# between the submit and the first step, and that cost is paid once per job, not once per step.
# So a cluster measurement is worth its start only when it runs many steps, and a sweep of short
# trials wants them in few jobs.
#
# The loop of this chapter: plan a setting (`tunekit.plan`), write its batch script
# (`plan.sbatch`), submit the Lab's run to the cluster, watch it, read it against the plan, and
# submit one without waiting (`wait=False`: the kernel stays free) and cancel it as Ctrl-C would. In CI it runs against the test cluster `make test` starts
# (`tools/slurm_cluster.py up`: Debian's slurmctld and slurmd on this machine); where no cluster
# is configured it says so and shows the script it would submit.

# %%
import subprocess
import tempfile
import time
from pathlib import Path
import plotly.graph_objects as go
import tunekit
from tunekit.models.gpt import GPTConfig
tunekit.use_renderer()   # plotly figures also drawn as SVG, so they show on GitHub and nbviewer
HERE = Path(tempfile.mkdtemp(prefix="tunekit-ch19-"))   # job folders: every node must see them
target = tunekit.Slurm(ntasks_per_node=2, time="5", folder=str(HERE / "jobs"))   # 2 ranks on one node, 5 minutes
problems = target.check()     # sbatch on the PATH, sinfo reaches a cluster, the partition can take it
CLUSTER = not problems
why = problems[0].splitlines() if problems else []
why = why[0] if len(why) == 1 else f"{why[0].split(': ')[0]}: {why[-1]}" if why else ""   # sinfo's last word
print("a cluster is configured: the runs below go through its scheduler" if CLUSTER else
      f"no cluster configured here ({why}): this chapter shows the script it would submit")

# %% [markdown]
# ## 1. Plan the setting
#
# The Lab's tiny GPT as DDP over two ranks on this CPU: micro-batch 2 of 32 tokens per rank.
# `tunekit.plan` says what a well-written run of it is expected to reach (chapter 18), before
# anything runs.

# %%
lab = tunekit.Lab(preset="cpu-tiny", device="cpu", log_path=HERE / "runs.jsonl")
MB, SEQ, STEPS = 2, 32, 5
plan = tunekit.plan(GPTConfig.preset("cpu-tiny"), device="cpu", micro_batch=MB, seq_len=SEQ,
                    parallel="ddp", world_size=2)
expected_s = plan.expected.step_s
print(f"planned: {plan.setting.parallel} over {plan.setting.world_size} ranks, expected "
      f"{expected_s * 1e3:.2f} ms per step, {plan.expected.tokens_per_s:,.0f} tokens/s per rank")

# %% [markdown]
# ## 2. Write the batch script
#
# `plan.sbatch(target, folder)` writes what a person would submit by hand: the node and task
# request the setting needs, `srun` starting one rank per task bound to its own cores
# (`--cpus-per-task`, `--cpu-bind=cores`; on a GPU partition one rank per GPU with
# `--gres-flags=enforce-binding`, so each rank's CPUs sit on its GPU's NUMA node), tunekit's worker,
# and the plan's expected step as a comment. `sbatch job.sh` runs it as written.

# %%
script = plan.sbatch(tunekit.Slurm(time="5"), HERE / "by-hand", model=GPTConfig.preset("cpu-tiny"), steps=STEPS)
text = script.read_text()
print(text)
assert "#SBATCH --ntasks-per-node=2" in text and f"# expected step {expected_s * 1e3:.1f} ms" in text

# %% [markdown]
# ## 3. Submit the Lab's run and watch it
#
# `on=target` is the only change to a local `lab.run`. While it waits, the job's state is printed
# as it changes (pending with the scheduler's reason, running on its node), then each step as
# rank 0 reports it through a file in the job's folder. Ctrl-C here would cancel the job.

# %%
result = None
if CLUSTER:
    t0 = time.monotonic()
    result = lab.run(steps=STEPS, warmup=1, micro_batch=MB, seq_len=SEQ, parallel="ddp", on=target,
                     progress=lambda done, total: print(f"  step {done}/{total}"), verbose=False)
    wall_s = time.monotonic() - t0
    job = result.job
    print(f"job {job['id']} on partition {job['partition']}, node(s) {job['nodes']}: {job['state']} "
          f"(exit {job['exit_code']}), {wall_s:.1f} s from submit to result; in the Lab's log as run "
          f"{result.run_id}: {result.label}")
    assert result.status == "ok" and job["state"] == "COMPLETED" and lab.log.runs[-1].run_id == result.run_id
else:
    print(f"not submitted: sbatch {script} is what would run")

# %% [markdown]
# ## 4. Read it against the plan
#
# The measured steps (rank 0's, from the job's progress file) beside the plan's expected step, and
# the job's start: from the submit to the first training step (`result.launch_s`: queue, srun, two
# interpreters importing torch, the rendezvous, the model built and wrapped).

# %%
fig = go.Figure()
fig.add_bar(x=["plan"], y=[expected_s * 1e3], name="expected by the plan")
if result is not None:
    steps_s = [float(p[2]) for p in (line.split() for line in
               (Path(result.job["folder"]) / "progress").read_text().splitlines()) if len(p) == 3]
    fig.add_bar(x=[f"step {i + 1}" for i in range(len(steps_s))], y=[s * 1e3 for s in steps_s],
                name="measured on the cluster")
    efficiency = expected_s / result.step_s
    per_job = result.launch_s / result.step_s
    print(f"measured {result.step_s * 1e3:.2f} ms per step (min {result.step_s_min * 1e3:.2f}, max "
          f"{result.step_s_max * 1e3:.2f}) against {expected_s * 1e3:.2f} ms expected: efficiency "
          f"{efficiency:.0%} (expected / measured); conditions: {result.conditions.verdict if result.conditions else '?'}")
    print(f"submit to first step: {result.launch_s:.1f} s, the time of {per_job:,.0f} steps")
fig.add_hline(y=expected_s * 1e3, line_dash="dash", annotation_text=f"expected {expected_s * 1e3:.2f} ms (plan)")
fig.update_layout(title="Steps on the cluster against the plan's expected step", yaxis_title="ms per step",
                  height=360, showlegend=True)
fig

# %% [markdown]
# ## 5. Submit without waiting, then cancel
#
# `wait=False` returns at once with a handle: a thread follows the job while the kernel stays free
# for other cells, and the line below updates in place (state, node, steps). `handle.result()`
# waits for the RunResult, recorded in the Lab's log as a waited run is; Ctrl-C in it cancels the
# job, as Ctrl-C in `lab.run` does. Here a job asked for far more steps than we mean to wait for is
# cancelled once it runs: `handle.cancel()` asks `scancel` and waits until `squeue` no longer lists
# it. A run cancelled this way is not recorded, and nothing of ours is left in the queue.

# %%
if CLUSTER:
    handle = lab.run(steps=500, warmup=1, micro_batch=MB, seq_len=SEQ, parallel="ddp", on=target, wait=False)
    deadline = time.monotonic() + 120
    while handle.steps_done < 1 and not handle.done() and time.monotonic() < deadline:
        time.sleep(0.2)        # the kernel is free meanwhile: any cell could run here
    print(f"{handle!r}; cancelling")
    runs_before = len(lab.log.runs)
    handle.cancel()
    queue = subprocess.run(["squeue", "-h", "-o", "%i %T"], capture_output=True, text=True).stdout.strip()
    print(f"job {handle.job.job_id}: {handle.job.state() or 'forgotten'}; squeue now lists: {queue or 'nothing'}")
    assert queue == "" and len(lab.log.runs) == runs_before
else:
    print("no cluster: nothing to cancel (handle.cancel() is scancel, then waiting until squeue forgets the job)")

# %% [markdown]
# ## Conclusion

# %%
if result is not None:
    print(f"The run came home from Slurm job {result.job['id']} ({result.job['state']}) as an ordinary "
          f"RunResult in the Lab's log. Its start cost {result.launch_s:.1f} s, the time of "
          f"{per_job:,.0f} of its steps: a cluster job pays its start once, so measure many steps per job "
          f"(and put a sweep's trials into few jobs), not one short run per job.")
    assert per_job > 10   # a job's start (two interpreters importing torch) against a step of a few ms
else:
    print(f"No cluster here, so nothing was submitted; the plan expects {expected_s * 1e3:.2f} ms per step, "
          f"and `sbatch {script.name}` in its folder is the whole step to the cluster.")

# %% [markdown]
# **Exercise.** Submit the same run with `steps=50`: how does the share of the job spent before the
# first step change, and does the measured step move toward the plan's?
