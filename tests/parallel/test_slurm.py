"""Runs on a real Slurm cluster (tools/slurm_cluster.py: Debian's slurmctld/slurmd on this machine):
a DDP run comes home as a RunResult with its job, and every way a job ends without a result is a
JobFailed with the cause in words; bad input is refused before anything is submitted."""
import math
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tunekit.models.gpt import GPT, GPTConfig
from tunekit.models.spec import model_spec
from tunekit.parallel.slurm import JobFailed, Slurm, time_seconds

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
import slurm_cluster  # noqa: E402

needs_cluster = pytest.mark.skipif(slurm_cluster.missing() is not None,
                                   reason=f"no test cluster here: {slurm_cluster.missing()}")
TINY = model_spec(GPT(GPTConfig(vocab_size=255, n_layer=2, n_head=4, n_embd=64, block_size=32)))


def spec(steps=2, model=TINY):
    return {"model": model, "parallel": "ddp", "steps": steps, "warmup": 1, "seed": 0,
            "toggles": {"micro_batch": 2, "seq_len": 32}, "peak_tflops": 1.0, "comm": False}


@pytest.mark.parametrize("text,seconds", [
    ("30", 1800),              # minutes
    ("05:30", 330),            # MM:SS
    ("00:30:00", 1800),        # HH:MM:SS
    ("1-12", 129600),          # D-HH: 36 h
    ("1-00:01", 86460),        # D-HH:MM
    ("2-01:00:05", 176405),    # D-HH:MM:SS: 2 x 86400 + 3600 + 5
])
def test_time_seconds(text, seconds):
    assert time_seconds(text) == seconds


@pytest.mark.parametrize("kw,words", [
    ({"time": "half an hour"}, "time is a Slurm time limit"),
    ({"nodes": 0}, "nodes"),
    ({"partition": "gpu nodes"}, "partition is a Slurm name without spaces"),
    ({"gpus_per_node": 8, "ntasks_per_node": 4}, "one rank per GPU"),
    ({"env": {"1BAD": "x"}}, "env maps variable names"),
])
def test_a_target_is_checked_as_it_is_made(kw, words):
    with pytest.raises(ValueError, match=words):
        Slurm(**kw)


def test_the_script_asks_for_what_the_target_says(tmp_path):
    text = Slurm(partition="gpu", nodes=2, gpus_per_node=8, time="00:20:00", account="ml", setup=("module load cuda",),
                 env={"NCCL_DEBUG": "WARN"}).script(["python", "-m", "tunekit.parallel.worker", "spec.json"],
                                                    tmp_path, comment=["expected step 120 ms"])
    for line in ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=8", "#SBATCH --gpus-per-node=8",
                 "#SBATCH --gres-flags=enforce-binding", "#SBATCH --exclusive", "#SBATCH --partition=gpu",
                 "#SBATCH --account=ml", "#SBATCH --time=00:20:00", "# expected step 120 ms", "module load cuda",
                 "export NCCL_DEBUG=WARN", "srun --kill-on-bad-exit=1 --cpus-per-task=$((SLURM_CPUS_ON_NODE / 8)) "
                 "--cpu-bind=cores python -m tunekit.parallel.worker spec.json"):
        assert line in text.splitlines(), line
    assert "--ntasks-per-socket" not in text     # sockets not known: not said


@pytest.mark.parametrize("kw,sockets,socket_line,srun_cpus", [
    ({"gpus_per_node": 8}, 2, "#SBATCH --ntasks-per-socket=4", "$((SLURM_CPUS_ON_NODE / 8))"),   # 8 ranks / 2
    ({"ntasks_per_node": 3}, 2, "#SBATCH --ntasks-per-socket=2", "$((SLURM_CPUS_ON_NODE / 3))"),  # ceil(3 / 2)
    ({"gpus_per_node": 4, "cpus_per_task": 6}, 1, None, "6"),    # one socket: nothing to spread over
])
def test_the_script_binds_each_rank_to_cores_of_its_own(tmp_path, kw, sockets, socket_line, srun_cpus):
    lines = Slurm(**kw).script(["python", "w.py"], tmp_path, sockets=sockets).splitlines()
    assert [ln for ln in lines if "ntasks-per-socket" in ln] == ([socket_line] if socket_line else [])
    assert lines[-1] == f"srun --kill-on-bad-exit=1 --cpus-per-task={srun_cpus} --cpu-bind=cores python w.py"


def test_the_master_port_is_one_free_on_the_head_node_not_one_derived_from_the_job_id(tmp_path):
    # two clusters on one host both run a job 1: a port derived from the job id (20001) collides
    # (CI failed so, EADDRINUSE); the script asks the head node for a free port as the job starts
    import socket

    text = Slurm().script(["true"], tmp_path)
    line = text[text.index("export MASTER_PORT="):text.index("\nsrun ")]
    with socket.socket() as held:
        held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        held.bind(("", 20001))
        held.listen()
        out = subprocess.run(["bash", "-c", line + "; echo $MASTER_PORT"], env={**os.environ, "SLURM_JOB_ID": "1"},
                             capture_output=True, text=True, check=True).stdout.split()
        port = int(out[-1])
        assert port != 20001
        with socket.socket() as s:    # free: a listener can take it
            s.bind(("", port))


def test_no_sbatch_is_said_before_anything(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    assert Slurm().check() == ["no sbatch on the PATH: run where Slurm's commands are (a login node), or install "
                               "the client (Debian: apt-get install slurm-client)"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    folder = tmp_path_factory.mktemp("slurm")
    # 4 CPUs on this 2-core machine: a run of 2 ranks and a job beside it fit together
    with slurm_cluster.cluster(folder, cpus=4) as env:
        old = os.environ.get("SLURM_CONF")
        os.environ.update(env)
        yield folder
        if old is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = old


def _ours():
    return subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True).stdout.split()


def _sbatch(*args):
    return subprocess.run(["sbatch", "--parsable", *args], capture_output=True, text=True, check=True).stdout.strip()


@needs_cluster
@pytest.mark.parametrize("kw,expected_s,words", [
    ({"partition": "gpuq"}, None, "no partition 'gpuq' on this cluster; it has ['debug']"),
    ({"nodes": 3}, None, "partition debug has 1 node(s), the run asks for 3: nodes<=1"),
    ({"gpus_per_node": 1}, None, "partition debug lists no GPUs (gres): leave gpus_per_node out"),
    ({"ntasks_per_node": 8}, None, "partition debug has 4 CPUs per node, the run asks for 8"),
    ({"time": "10"}, 900.0, "time=10 (600 s) is shorter than the run is expected to take (900 s)"),
])
def test_bad_input_is_refused_before_anything_is_submitted(cluster, tmp_path, kw, expected_s, words):
    target = Slurm(**({"ntasks_per_node": 2, **kw} if "gpus_per_node" not in kw else kw))
    assert any(words in p for p in target.check(expected_s))
    if expected_s is None:
        with pytest.raises(ValueError, match="partition|node|CPUs"):
            target.submit(spec(), tmp_path / "job")
    assert _ours() == [] and not (tmp_path / "job" / "job.sh").exists()


@needs_cluster
def test_a_ddp_run_comes_home_with_its_job(cluster, tmp_path):
    steps = []
    states = []
    job = Slurm(partition="debug", ntasks_per_node=2, time="5").submit(spec(steps=3), tmp_path / "job")
    r = job.wait(progress=lambda done, total: steps.append((done, total)),
                 on_state=lambda state, info: states.append(state))
    assert (r.status, r.world_size, r.parallel, len(r.losses)) == ("ok", 2, "ddp", 4)   # 1 warm-up + 3 timed
    assert steps == [(1, 3), (2, 3), (3, 3)] and "RUNNING" in states
    assert {k: r.job[k] for k in ("engine", "id", "partition", "nodes", "state", "exit_code")} == \
        {"engine": "slurm", "id": job.job_id, "partition": "debug", "nodes": "n0", "state": "COMPLETED",
         "exit_code": "0:0"}
    assert r.job["shared_with"] == [] and _ours() == []
    # the test cluster's node: CPUs=4 and no topology in slurm.conf, which Slurm reads as 4 sockets
    # (scontrol show node: Sockets=4): the 2 ranks are spread one per socket, each bound to its cores
    assert "#SBATCH --ntasks-per-socket=1" in (job.folder / "job.sh").read_text().splitlines()
    assert [(x["rank"], x["node"]) for x in r.job["ranks"]] == [(0, "n0"), (1, "n0")]


@pytest.mark.slow   # a second cluster, a job (fast: test_the_script_binds_each_rank_to_cores_of_its_own)
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="one CPU here: nothing to bind two ranks apart on")
@needs_cluster
def test_each_rank_is_bound_to_cores_of_its_own(cluster, tmp_path, monkeypatch):
    # a cluster of this machine's own CPUs (the module's has more than there are, and so binds none):
    # Slurm's task/affinity binds each rank to its share of them, srun --cpu-bind=cores
    with slurm_cluster.cluster(tmp_path / "honest") as env:
        monkeypatch.setenv("SLURM_CONF", env["SLURM_CONF"])
        job = Slurm(ntasks_per_node=2, time="5").submit(spec(), tmp_path / "job")
        r = job.wait()
    text = (job.folder / "job.sh").read_text()
    assert text.splitlines()[-1].startswith("srun --kill-on-bad-exit=1 --cpus-per-task=$((SLURM_CPUS_ON_NODE / 2)) "
                                            "--cpu-bind=cores ")
    ranks = r.job["ranks"]
    assert [x["rank"] for x in ranks] == [0, 1] and ranks[0]["cpus"] and ranks[1]["cpus"]
    assert not set(ranks[0]["cpus"]) & set(ranks[1]["cpus"])      # disjoint: each rank its own cores
    cpus = len(os.sched_getaffinity(0))
    assert len(ranks[0]["cpus"]) == len(ranks[1]["cpus"]) == cpus // 2   # an equal share of the node's CPUs


@pytest.mark.slow   # a job (the torchrun path's: tests/parallel/test_dist.py)
@needs_cluster
def test_a_rank_exception_names_node_rank_and_traceback(cluster, tmp_path):
    (tmp_path / "failing_model.py").write_text(
        "import os\nfrom tunekit.models.gpt import GPT, GPTConfig\n"
        "def build():\n    if os.environ.get('RANK') == '1':\n        raise RuntimeError('rank 1 was told to fail')\n"
        "    return GPT(GPTConfig(vocab_size=255, n_layer=2, n_head=4, n_embd=64, block_size=32))\n")
    sys.path.insert(0, str(tmp_path))     # the ranks import what this process can (PYTHONPATH)
    try:
        failing = {"kind": "factory", "factory": "failing_model:build", "kwargs": {}}
        job = Slurm(ntasks_per_node=2, time="5").submit(spec(model=failing), tmp_path / "job")
        with pytest.raises(JobFailed) as e:
            job.wait()
    finally:
        sys.path.remove(str(tmp_path))
    assert "rank 1 on node n0 failed" in e.value.cause and "RuntimeError: rank 1 was told to fail" in e.value.cause
    assert e.value.job["state"] == "FAILED" and _ours() == []


@pytest.mark.slow   # a job (fast: tests/lab/test_cluster_run.py, a cancelled handle)
@needs_cluster
def test_ctrl_c_while_waiting_cancels_the_job(cluster, tmp_path):
    job = Slurm(ntasks_per_node=2, time="5").submit(spec(steps=10_000), tmp_path / "job")

    def interrupt(done, total):
        raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        job.wait(progress=interrupt)
    assert _ours() == []


@pytest.mark.slow   # a job
@needs_cluster
def test_a_job_cancelled_from_outside_is_a_failure_with_its_steps_kept(cluster, tmp_path):
    job = Slurm(ntasks_per_node=2, time="5").submit(spec(steps=10_000), tmp_path / "job")
    cancelled = threading.Event()

    def progress(done, total):
        if done >= 2 and not cancelled.is_set():
            cancelled.set()
            subprocess.run(["scancel", job.job_id], check=True)
    with pytest.raises(JobFailed) as e:
        job.wait(progress=progress)
    assert e.value.cause.startswith("the job was cancelled (scancel, by you or an administrator)")
    assert len(e.value.step_s) >= 2 and all(s > 0 for s in e.value.step_s)
    assert "steps measured" in e.value.cause and _ours() == []


@pytest.mark.slow   # two jobs
@needs_cluster
def test_a_job_that_never_starts_is_cancelled_and_said(cluster, tmp_path):
    blocker = _sbatch("--exclusive", "-o", "/dev/null", "--wrap", "sleep 120")
    try:
        job = Slurm(ntasks_per_node=2, time="5", start_timeout_s=3).submit(spec(), tmp_path / "job")
        with pytest.raises(JobFailed, match=r"the job never started: pending \((Resources|Priority)\) for 3 s, "
                                            r"then cancelled"):
            job.wait()
    finally:
        subprocess.run(["scancel", blocker])
    deadline = time.monotonic() + 30
    while _ours() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _ours() == []


@pytest.mark.slow   # two jobs
@needs_cluster
def test_a_node_shared_with_another_job_marks_the_run_busy(cluster, tmp_path):
    other = _sbatch("-n", "1", "-o", "/dev/null", "--wrap", "sleep 120")
    try:
        r = Slurm(ntasks_per_node=2, time="5", exclusive=False).submit(spec(), tmp_path / "job").wait()
    finally:
        subprocess.run(["scancel", other])
    assert r.job["shared_with"] == [other]
    assert r.conditions.busy and r.conditions.reason.startswith(f"node(s) n0 shared with job(s) {other}")
    assert [n.kind for n in r.notes if getattr(n, "kind", "") == "conditions.shared_node"] == ["conditions.shared_node"]


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory):
    """A 2-node cluster (one slurmd per network namespace, joined by the emulated link), up for the
    module; each test that takes it reaches it through `on_two_nodes`."""
    from tunekit.parallel.netns import check

    if slurm_cluster.missing() is not None:
        pytest.skip(f"no test cluster here: {slurm_cluster.missing()}")
    if os.geteuid() != 0 or shutil.which("nsenter") is None:
        pytest.skip("needs root and nsenter")
    if check():
        pytest.skip(check())
    with slurm_cluster.cluster(tmp_path_factory.mktemp("slurm2"), nodes=2) as env:
        yield env
    leftover = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert f"tk-{os.getpid()}-" not in leftover     # this process's namespaces are gone


@pytest.fixture
def on_two_nodes(two_nodes, monkeypatch):
    for k, v in two_nodes.items():
        monkeypatch.setenv(k, v)     # this test's Slurm commands reach the 2-node cluster, the next ones not
    return Slurm(nodes=2, ntasks_per_node=1, time="5", env={"GLOO_SOCKET_IFNAME": "tk0"})


@pytest.mark.slow   # a 2-node cluster and a job
def test_a_two_node_fsdp_run_goes_through_the_scheduler(on_two_nodes, tmp_path):
    r = on_two_nodes.submit({**spec(), "parallel": "fsdp", "comm": True}, tmp_path / "job").wait()
    # FSDP2 over 2 ranks on 2 nodes: every all-gather and reduce-scatter crosses the emulated link
    assert (r.status, r.world_size, r.nodes, r.parallel, r.job["nodes"]) == ("ok", 2, 2, "fsdp", "n[0-1]")
    assert set(r.comm["by_kind"]) >= {"all_gather", "reduce_scatter"}


@pytest.mark.slow   # a 2-node cluster and a job
def test_a_node_that_dies_mid_run_ends_it_as_a_failure_naming_the_node(on_two_nodes, tmp_path):
    downed = []

    def node_dies(done, total):
        if done == 2 and not downed:      # n1 taken down as an administrator (or a dead node) would be
            downed.append(time.monotonic())
            subprocess.run(["scontrol", "update", "nodename=n1", "state=down", "reason=tunekit-test"], check=True)
    job = on_two_nodes.submit(spec(steps=10_000), tmp_path / "job")
    try:
        with pytest.raises(JobFailed) as e:
            job.wait(progress=node_dies)
        ended_s = time.monotonic() - downed[0]
    finally:
        subprocess.run(["scontrol", "update", "nodename=n1", "state=resume"], capture_output=True)
    assert e.value.cause.startswith("a node of the job failed: n1 down (tunekit-test) (job "), e.value.cause
    assert e.value.job["state"] == "NODE_FAIL" and e.value.job["nodes"] == "n[0-1]"
    assert ended_s < 30                                    # no hang: Slurm ends the job at once
    assert len(e.value.step_s) >= 2 and all(s > 0 for s in e.value.step_s)   # the steps measured before, kept
    assert _ours() == []                                   # nothing left queued (--no-requeue)


@pytest.fixture(scope="module")
def tiny_plan():
    import tunekit

    cfg = tunekit.GPTConfig.preset("cpu-tiny")
    return cfg, tunekit.plan(cfg, device="cpu", micro_batch=2, seq_len=32, parallel="ddp", world_size=2)


def test_a_plan_script_asks_for_the_setting_s_layout(tiny_plan, tmp_path):
    cfg, plan = tiny_plan
    text = plan.sbatch(Slurm(partition="debug", time="5"), tmp_path, model=cfg, steps=3).read_text()
    assert "#SBATCH --nodes=1" in text and "#SBATCH --ntasks-per-node=2" in text
    expected = plan.expected.step_s * 1e3
    assert f"# expected step {expected:.1f} ms" in text     # the plan's own figure, as a comment
    # its MFU as the plan's text rounds it (one decimal; under 1%, two significant digits: a small
    # model's 0.055% is not '0%' nor '0.1%')
    mfu = 100 * plan.expected.mfu
    said = f"{mfu:.1f}%" if mfu >= 1 else f"{mfu:.{1 - math.floor(math.log10(mfu))}f}%"
    assert f"MFU {said} (tunekit.plan's expectation" in text
    spec = __import__("json").loads((tmp_path / "spec.json").read_text())
    assert (spec["parallel"], spec["nproc"], spec["nodes"], spec["steps"], spec["toggles"]["micro_batch"]) == \
        ("ddp", 2, 1, 3, 2)
    with pytest.raises(ValueError, match=r"the target asks for ntasks_per_node=4 \(the setting needs 2\)"):
        plan.sbatch(Slurm(ntasks_per_node=4), tmp_path / "x", model=cfg)
    with pytest.raises(IndexError):
        plan.sbatch(Slurm(), tmp_path / "y", model=cfg, option=len(plan.advice))


@pytest.mark.slow   # a job (fast: test_a_plan_script_asks_for_the_setting_s_layout)
@needs_cluster
def test_a_plan_script_runs_as_written(cluster, tiny_plan, tmp_path):
    cfg, plan = tiny_plan
    path = plan.sbatch(Slurm(time="5"), tmp_path / "job", model=cfg, steps=2)
    job_id = _sbatch(str(path))       # submitted by hand, as a person would
    r = Slurm().follow(job_id, tmp_path / "job", steps=2).wait()
    assert (r.status, r.world_size, r.parallel, r.job["state"]) == ("ok", 2, "ddp", "COMPLETED")


@pytest.mark.slow   # a job
@needs_cluster
def test_a_plan_script_runs_your_own_script_with_its_rank(cluster, tiny_plan, tmp_path):
    cfg, plan = tiny_plan
    (tmp_path / "train.py").write_text("import os\nopen(os.path.join(os.path.dirname(__file__), "
                                       "'rank-' + os.environ['RANK']), 'w').write(os.environ['WORLD_SIZE'] + "
                                       "' ' + os.environ['LOCAL_RANK'] + ' ' + os.environ['MASTER_PORT'])\n")
    path = plan.sbatch(Slurm(time="5"), tmp_path / "job", script=f"{sys.executable} {tmp_path / 'train.py'}")
    assert "tunekit.Monitor(model, log_to=[...])" in path.read_text()
    job = Slurm().follow(_sbatch(str(path)), tmp_path / "job")
    with pytest.raises(JobFailed, match="the job completed without a tunekit result"):
        job.wait()
    got = sorted((tmp_path / f"rank-{r}").read_text().split()[:2] for r in (0, 1))
    assert got == [["2", "0"], ["2", "1"]]


@pytest.mark.slow   # a job (fast: tests/lab/test_cluster_run.py)
@needs_cluster
def test_a_lab_run_on_the_cluster_is_in_the_lab_s_log(cluster, tmp_path, capsys):
    import tunekit

    lab = tunekit.Lab(preset="cpu-tiny", device="cpu", log_path=tmp_path / "runs.jsonl")
    target = Slurm(ntasks_per_node=2, time="5", folder=str(tmp_path / "jobs"))
    r = lab.run(steps=2, warmup=1, micro_batch=2, seq_len=32, parallel="ddp", on=target, verbose=False)
    assert (r.status, r.world_size, r.job["state"], r.label.split()[:2]) == ("ok", 2, "COMPLETED", ["ddp", "1x2"])
    assert r.job["folder"].startswith(str(tmp_path / "jobs"))
    # tunekit.explain of the run that came home: its whole step against the Lab's plan of its setting and
    # layout (2 ddp ranks on the CPU), where it ran said first
    e = tunekit.explain(r)
    plan = lab.plan("cpu", verbose=False, parallel="ddp", world_size=2, **r.toggles.asdict())
    assert (e.label, e.measured_s, e.expected_s) == (f"run #{r.run_id} ({r.label})", r.step_s, plan.expected.step_s)
    assert e.table.loc[0, ["group", "measured_s", "expected_s"]].tolist() == ["whole step", r.step_s,
                                                                              plan.expected.step_s]
    where = str(e.notes[0])
    assert where.startswith(f"slurm job {r.job['id']} on n0 (partition debug, COMPLETED); rank 0 on n0 (CPUs ")
    assert ", rank 1 on n0 (CPUs " in where and e.summary.startswith(f"run #{r.run_id} ({r.label}): ")
    # one rank (one process, the model as it is), not waited for: a handle at once, the kernel free
    handle = lab.run(steps=2, warmup=1, micro_batch=2, seq_len=32, on=Slurm(time="5", folder=str(tmp_path / "jobs")),
                     wait=False)
    assert not handle.done() and [x.run_id for x in lab.log.runs] == [r.run_id]   # back before the job ran
    assert repr(handle).startswith(f"ClusterRun(slurm job {handle.job.job_id}: ")
    one = handle.result(timeout=300)
    assert (one.status, one.world_size, one.parallel, one.job["state"]) == ("ok", 1, None, "COMPLETED")
    assert [x.run_id for x in lab.log.runs] == [r.run_id, one.run_id]     # recorded as a waited run is
    assert handle.result() is one and handle.steps_done == 2
    out = capsys.readouterr().out.splitlines()   # not a notebook: a line per state, then the run's
    assert f"slurm job {handle.job.job_id}: running on n0" in out
    assert out[-1].startswith(f"slurm job {handle.job.job_id}: run #{one.run_id} 1x1 ") and _ours() == []


@pytest.mark.slow   # a job (fast: tests/lab/test_cluster_run.py)
@needs_cluster
def test_a_lab_run_that_fails_on_the_cluster_is_recorded_and_raised(cluster, tmp_path):
    import tunekit

    lab = tunekit.Lab(preset="cpu-tiny", device="cpu", log_path=tmp_path / "runs.jsonl")
    target = Slurm(ntasks_per_node=2, time="5", folder=str(tmp_path / "jobs"))
    job_ids = []

    def cancel_after_two(done, total):
        if done == 2 and not job_ids:
            job_ids.append(subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True).stdout.split())
            subprocess.run(["scancel", *job_ids[0]], check=True)
    with pytest.raises(JobFailed, match="the job was cancelled"):
        lab.run(steps=10_000, warmup=1, micro_batch=2, seq_len=32, parallel="ddp", on=target,
                progress=cancel_after_two, verbose=False)
    failed = lab.log.runs[-1]
    assert failed.status == "failed" and failed.error.startswith("the job was cancelled")
    assert failed.job["state"] == "CANCELLED" and failed.step_s > 0   # the steps measured before, kept


@pytest.mark.slow   # a job (fast: tests/lab/test_cluster_run.py)
@needs_cluster
def test_ctrl_c_in_a_not_waited_run_s_result_cancels_it_unrecorded(cluster, tmp_path):
    import _thread

    import tunekit

    lab = tunekit.Lab(preset="cpu-tiny", device="cpu", log_path=tmp_path / "runs.jsonl")
    target = Slurm(ntasks_per_node=2, time="5", folder=str(tmp_path / "jobs"))
    handle = lab.run(steps=10_000, warmup=1, micro_batch=2, seq_len=32, parallel="ddp", on=target, wait=False,
                     verbose=False)
    deadline = time.monotonic() + 60
    while handle.steps_done < 2 and time.monotonic() < deadline:
        time.sleep(0.2)                 # the kernel is free meanwhile: this loop is the user's work
    assert handle.steps_done >= 2 and handle.state == "RUNNING"
    threading.Timer(0.5, _thread.interrupt_main).start()    # Ctrl-C while result() waits
    with pytest.raises(KeyboardInterrupt):
        handle.result()
    assert _ours() == [] and handle.done() and lab.log.runs == []    # cancelled, as the waited form
    with pytest.raises(JobFailed, match="the job was cancelled"):
        handle.result()


@needs_cluster
def test_a_lab_run_refuses_a_time_limit_shorter_than_its_expected_run(cluster, tmp_path):
    import tunekit

    lab = tunekit.Lab(preset="cpu-tiny", device="cpu", log_path=tmp_path / "runs.jsonl")
    target = Slurm(time="1", folder=str(tmp_path / "jobs"))      # 1 minute
    with pytest.raises(ValueError, match=r"time=1 \(60 s\) is shorter than the run is expected to take \(\d+ s: "
                                         r"100001 steps x [\d.e-]+ s, the plan's expected step \(lab.plan\)\)"):
        lab.run(steps=100_000, warmup=1, micro_batch=2, seq_len=32, on=target, verbose=False)
    measured = lab.run(steps=2, warmup=1, micro_batch=2, seq_len=32, verbose=False)   # here, on this setting
    measured.step_s = 0.5               # as if a step took 0.5 s: 199 steps + 1 warm-up = 100 s > 60 s
    words = (f"time=1 (60 s) is shorter than the run is expected to take (100 s: 200 steps x 0.5 s, the step "
             f"of run #{measured.run_id} on this setting here): ask for more time")
    with pytest.raises(ValueError) as e:
        lab.run(steps=199, warmup=1, micro_batch=2, seq_len=32, on=target, verbose=False)
    assert words in str(e.value)
    assert _ours() == [] and not list((tmp_path / "jobs").glob("*"))   # nothing submitted
    with pytest.raises(ValueError, match="wait=False is for a cluster run"):
        lab.run(steps=2, wait=False, verbose=False)


def test_a_lab_refuses_a_cluster_run_it_cannot_make(tmp_path):
    import tunekit

    lab = tunekit.Lab(preset="cpu-tiny", device="cpu", log_path=tmp_path / "runs.jsonl")
    with pytest.raises(ValueError, match="on= is a cluster target"):
        lab.run(steps=2, on="slurm", verbose=False)
    with pytest.raises(ValueError, match="takes its layout from the target"):
        lab.run(steps=2, on=Slurm(), nproc=2, verbose=False)


def test_tunekit_plan_writes_the_batch_script(tmp_path, capsys):
    from tunekit.cli.main import main

    code = main(["plan", "--model", "cpu-tiny", "--device", "cpu", "--micro-batch", "2", "--seq-len", "32",
                 "--sbatch", str(tmp_path / "job"), "--time", "10"])
    out = capsys.readouterr().out
    text = (tmp_path / "job" / "job.sh").read_text()
    assert code == 0 and f"batch script: {tmp_path / 'job' / 'job.sh'}" in out
    assert "#SBATCH --time=10" in text and "# expected step " in text and "tunekit.parallel.worker" in text
    assert main(["plan", "--model", "cpu-tiny", "--device", "cpu", "--sbatch", str(tmp_path / "x"),
                 "--option", "3"]) == 2
    assert "--option 3: the plan's advice has 0 option(s)" in capsys.readouterr().err


def test_tunekit_run_slurm_refuses_what_cannot_go(monkeypatch, capsys):
    from tunekit.cli.main import main

    assert main(["run", "--slurm", "gpu", "--time", "half an hour"]) == 2
    assert "--slurm: time is a Slurm time limit" in capsys.readouterr().err
    assert main(["run", "--slurm", "gpu", "--trace"]) == 2
    assert "--slurm submits the run to a cluster: not with --link-*, --trace" in capsys.readouterr().err
    monkeypatch.setenv("PATH", "/nonexistent")
    assert main(["run", "--slurm", "gpu", "--steps", "1"]) == 2
    assert "no sbatch on the PATH" in capsys.readouterr().err


@pytest.mark.slow   # a job (fast: test_tunekit_run_slurm_refuses_what_cannot_go)
@needs_cluster
def test_tunekit_run_slurm_runs_the_job(cluster, tmp_path, capsys):
    from tunekit.cli.main import main

    code = main(["run", "--slurm", "default", "--nproc", "2", "--parallel", "ddp", "--steps", "2", "--warmup", "1",
                 "--micro-batch", "2", "--seq-len", "32", "--time", "5", "--log", str(tmp_path / "runs.jsonl"),
                 "--report", str(tmp_path / "report.html")])
    out = capsys.readouterr().out
    assert code == 0 and "pending" in out and "slurm job" in out and "(partition debug): COMPLETED" in out
    assert _ours() == []


@needs_cluster
@pytest.mark.slow
def test_a_job_past_its_time_limit_is_a_failure_with_its_steps_kept(cluster, tmp_path):
    job = Slurm(ntasks_per_node=2, time="1").submit(spec(steps=1_000_000), tmp_path / "job")   # 1 minute
    with pytest.raises(JobFailed) as e:
        job.wait()
    assert e.value.cause.startswith("the job hit its time limit (1)") and e.value.job["state"] == "TIMEOUT"
    assert len(e.value.step_s) > 0 and f"{len(e.value.step_s)} of 1000000 steps measured" in e.value.cause
    assert _ours() == []


def test_the_dashboard_runs_on_a_cluster_target_it_was_given(make_lab, monkeypatch):
    lab = make_lab(peak_tflops=1.0, micro_batch=4, seq_len=64)
    assert lab.dashboard().run_on.layout.display == "none"        # no target: no menu
    target = Slurm(partition="gpu", nodes=2, gpus_per_node=4)
    dash = lab.dashboard(on=target)
    assert dash.run_on.options == (("this machine", None), ("slurm gpu 2x4", target))
    seen = {}

    def run(**kw):
        seen.update(kw)
        raise ValueError("stop here")        # the call is what this test reads
    monkeypatch.setattr(lab, "run", run)
    dash.controls["steps"].value, dash.trace_box.value = 2, True
    dash.run_on.value = target
    dash._on_run()
    # 8 ranks: ddp; not waited for (the kernel stays free); no trace (one process here, not a job)
    assert (seen["on"], seen["parallel"], seen["wait"], "trace" in seen) == (target, "ddp", False, False)
    assert not dash.run_button.disabled and dash.stop_button.layout.display == "none"   # refused: Run again
    assert "stop here" in dash.message.value
    seen.clear()
    dash.run_on.value = None
    dash._on_run()
    assert "on" not in seen and "parallel" not in seen and seen["trace"] is True   # this machine, as before
    assert "wait" not in seen


def _text(value: str) -> str:
    import re

    return __import__("html").unescape(re.sub(r"<[^>]+>", "", value))


def _until(test, what: str, timeout_s: float = 120.0):
    deadline = time.monotonic() + timeout_s
    while not test():
        assert time.monotonic() < deadline, f"no {what} in {timeout_s:.0f} s"
        time.sleep(0.1)    # the kernel is free meanwhile: this loop is the user's work


def _cluster_dash(make_lab, tmp_path, steps, **kw):
    from tunekit.lab.dashboard import Dashboard

    lab = make_lab(peak_tflops=1.0, micro_batch=2, seq_len=32)
    target = Slurm(time="5", folder=str(tmp_path / "jobs"), **{"ntasks_per_node": 2, **kw})
    dash = Dashboard(lab, on=target, expect=False)
    dash.controls["steps"].value, dash.controls["warmup"].value = steps, 1
    dash.run_on.value = target
    lines = []
    dash.job_line.observe(lambda change: lines.append(_text(change["new"])), names="value")
    return lab, dash, lines


@pytest.mark.slow   # a job (fast: test_the_dashboard_runs_on_a_cluster_target_it_was_given)
@needs_cluster
def test_the_dashboard_runs_on_the_cluster_without_blocking_and_logs_the_run(cluster, make_lab, tmp_path):
    lab, dash, lines = _cluster_dash(make_lab, tmp_path, steps=2)
    dash.run_button.click()
    handle = dash.cluster_run
    assert handle is not None and not handle.done() and lab.log.runs == []    # Run returned before the job ran
    assert dash.run_button.disabled and dash.stop_button.layout.display == ""
    r = handle.result(timeout=300)      # the dashboard has shown the end before result() returns
    assert (r.status, r.world_size, r.job["state"]) == ("ok", 2, "COMPLETED") and lab.log.runs == [r]
    job = handle.job.job_id
    assert f"slurm job {job}: running on n0" in lines            # the status line followed the job
    assert any(line.startswith(f"slurm job {job}: ") and "step 2/2" in line for line in lines)
    assert lines[-1].startswith(f"slurm job {job}: run #{r.run_id} ddp 1x2 ")
    assert f"run #{r.run_id} (ddp 1x2 " in _text(dash.message.value)   # shown as a run here is
    assert (dash.progress.value, dash.progress.description, dash.run_button.disabled,
            dash.stop_button.layout.display) == (2, "done", False, "none")
    assert len(dash.table_df) == 1 and _ours() == []


@pytest.mark.slow   # a job
@needs_cluster
def test_the_dashboard_stop_button_cancels_a_running_job_unrecorded(cluster, make_lab, tmp_path):
    lab, dash, lines = _cluster_dash(make_lab, tmp_path, steps=10_000)
    dash.run_button.click()
    handle = dash.cluster_run
    _until(lambda: handle.steps_done >= 2 and "step" in dash.progress.description, "step")
    assert " step " in lines[-1] and lines[-1].endswith("/10000")    # "... running on n0, step 3/10000"
    dash.stop_button.click()
    assert _ours() == [] and handle.done() and handle.cancelled and lab.log.runs == []
    assert _text(dash.message.value) == f"slurm job {handle.job.job_id} cancelled: not recorded"
    assert (dash.progress.description, dash.run_button.disabled, dash.stop_button.layout.display) == \
        ("cancelled", False, "none")


@pytest.mark.slow   # two jobs
@needs_cluster
def test_the_dashboard_says_a_pending_job_s_reason_and_a_failure_s_cause(cluster, make_lab, tmp_path):
    blocker = _sbatch("--exclusive", "-o", "/dev/null", "--wrap", "sleep 120")
    try:
        lab, dash, lines = _cluster_dash(make_lab, tmp_path, steps=2)
        dash.run_button.click()
        handle = dash.cluster_run
        _until(lambda: handle.state == "PENDING" and handle.info.get("Reason") not in (None, "None"), "reason")
        reason = handle.info["Reason"]     # Slurm's word: Resources (the blocker holds the node) or Priority
        assert reason in ("Resources", "Priority")
        _until(lambda: dash.progress.description == f"pending: {reason}", "pending in the progress bar", 10)
        assert f"slurm job {handle.job.job_id}: pending ({reason})" in lines
        subprocess.run(["scancel", handle.job.job_id], check=True)     # from outside: a failure, recorded
        with pytest.raises(JobFailed):
            handle.result(timeout=120)
    finally:
        subprocess.run(["scancel", blocker])
    assert _text(dash.message.value).startswith("run on the cluster failed: the job was cancelled (scancel")
    assert [x.status for x in lab.log.runs] == ["failed"] and dash.progress.description == "failed"
    assert not dash.run_button.disabled and dash.stop_button.layout.display == "none"
