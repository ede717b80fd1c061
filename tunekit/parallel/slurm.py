"""Runs on a Slurm cluster, through Slurm's own commands: ``sbatch`` submits, ``scontrol`` and
``squeue`` say what the job is doing, ``scancel`` stops it. Engine.

    >>> cluster = Slurm(partition="gpu", nodes=2, gpus_per_node=8, time="00:20:00")
    >>> job = cluster.submit(spec, folder)        # spec: tunekit.parallel.worker's
    >>> job.wait(progress=print)                  # RunResult, or JobFailed with the cause in words

Why the commands and not a Python client (submitit): the batch script is the interface a cluster's
users and admins read, the one `Plan.sbatch` writes for a person to submit; the run here submits
that same script, so what the notebook runs and what a person would run are one text. No
scheduling logic of our own: Slurm places, starts, times out and cancels.

How the ranks start: ``srun``, one task per GPU (on a CPU partition, ``ntasks_per_node`` tasks per
node), each task one rank of ``python -m tunekit.parallel.worker`` (the same worker a local run
starts), which reads its rank from Slurm's variables (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID) and
meets the others at the first node's address (MASTER_ADDR, from ``scontrol show node``). srun
rather than torchrun per node: Slurm then knows every rank (accounting, signals, ``--kill-on-bad-exit``
ends the job when one rank dies), and binds each task near its GPU (``--gres-flags=enforce-binding``),
as the documents this project mirrors recommend.

Another engine (Kubernetes, SkyPilot) is one more class with the same three methods: ``check``,
``script``/``submit``, and a job with ``info``, ``wait`` and ``cancel``.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from tunekit.core.conditions import BUSY, Conditions
from tunekit.core.results import RunResult
from tunekit.core.toggles import Toggles
from tunekit.core.validate import whole

ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED",
         "BOOT_FAIL", "DEADLINE", "SPECIAL_EXIT")
CAUSES = {   # a job's end state -> what happened, in words
    "FAILED": "a rank exited with an error",
    "CANCELLED": "the job was cancelled (scancel, by you or an administrator)",
    "TIMEOUT": "the job hit its time limit",
    "NODE_FAIL": "a node of the job failed",
    "OUT_OF_MEMORY": "a rank ran out of host memory (the job's memory limit)",
    "PREEMPTED": "the job was preempted by a higher-priority job",
    "BOOT_FAIL": "a node failed to boot",
    "DEADLINE": "the job reached its deadline",
}
_TIME = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")


def time_seconds(text: str) -> int:
    """A Slurm time limit in seconds: "30" (minutes), "MM:SS", "HH:MM:SS", "D-HH", "D-HH:MM",
    "D-HH:MM:SS" (sbatch(1), --time). "00:30:00" -> 1800; "1-12" -> 129600."""
    m = _TIME.match(str(text).strip())
    if not m:
        raise ValueError(f"time is a Slurm time limit such as '00:30:00', '90' (minutes) or '1-12' "
                         f"(days-hours), got {text!r}")
    days, a, b, c = m.groups()
    parts = [int(x) for x in (a, b, c) if x is not None]
    if days is not None:       # D-HH, D-HH:MM, D-HH:MM:SS
        h, mi, s = (parts + [0, 0])[:3]
        return int(days) * 86400 + h * 3600 + mi * 60 + s
    if len(parts) == 1:        # minutes
        return parts[0] * 60
    if len(parts) == 2:        # MM:SS
        return parts[0] * 60 + parts[1]
    return parts[0] * 3600 + parts[1] * 60 + parts[2]


def _run(cmd: list[str], timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


@dataclass(frozen=True)
class Partition:
    """What ``sinfo`` says of one partition."""

    name: str
    nodes: int
    cpus_per_node: int
    gpus_per_node: int          # 0: the partition's nodes list no GPU resource (gres)
    time_limit_s: float         # inf: no limit
    default: bool = False


def partitions() -> dict[str, Partition]:
    """Every partition of the cluster ``sinfo`` reaches (SLURM_CONF, else the machine's)."""
    out = _run(["sinfo", "-h", "-o", "%P|%D|%c|%G|%l"])
    if out.returncode != 0:
        raise RuntimeError(f"sinfo could not reach the cluster: {out.stderr.strip() or out.stdout.strip()}")
    found = {}
    for line in out.stdout.splitlines():
        name, nodes, cpus, gres, limit = line.split("|")
        default = name.endswith("*")
        name = name.rstrip("*")
        gpus = sum(int(n) for n in re.findall(r"gpu(?::[\w.-]+)?:(\d+)", gres))
        seconds = float("inf") if limit in ("infinite", "UNLIMITED", "n/a") else time_seconds(limit)
        cpus = int(re.sub(r"\D.*", "", cpus) or 0)
        old = found.get(name)
        nodes_n = int(nodes) + (old.nodes if old else 0)   # one line per node state: summed
        found[name] = Partition(name, nodes_n, cpus, gpus, seconds, default or (old.default if old else False))
    return found


@dataclass(frozen=True)
class Slurm:
    """Where a run goes: a Slurm partition, in Slurm's own words (sbatch(1)).

    ``partition`` None: the cluster's default. ``nodes`` x ``gpus_per_node`` ranks, one per GPU; on
    a partition without GPUs, ``ntasks_per_node`` ranks per node (default 1). ``time`` the job's
    limit; ``exclusive`` asks for whole nodes (no other job shares them while the run measures).
    ``setup`` lines run before the ranks start (``module load ...``, ``source venv/bin/activate``);
    ``env`` variables for every rank. ``max_jobs`` bounds how many jobs an autotune sweep keeps in
    the queue at once; ``start_timeout_s`` how long a job may wait to start before it is cancelled
    and recorded as never started (None: as long as Slurm keeps it). ``python`` the interpreter the
    ranks run (default this one: a cluster whose nodes see this machine's paths)."""

    partition: str | None = None
    nodes: int = 1
    gpus_per_node: int | None = None
    cpus_per_task: int | None = None
    time: str = "00:30:00"
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    exclusive: bool = True
    setup: tuple = ()
    env: dict | None = None
    ntasks_per_node: int | None = None
    max_jobs: int = 4
    start_timeout_s: float | None = None
    python: str = field(default_factory=lambda: sys.executable)

    def __post_init__(self):
        whole("nodes", self.nodes)
        whole("max_jobs", self.max_jobs)
        for name in ("gpus_per_node", "cpus_per_task", "ntasks_per_node"):
            if getattr(self, name) is not None:
                whole(name, getattr(self, name))
        time_seconds(self.time)
        for name in ("partition", "account", "qos", "constraint"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, str) or not v or any(c.isspace() for c in v)):
                raise ValueError(f"{name} is a Slurm name without spaces, got {v!r}")
        if isinstance(self.setup, str):
            object.__setattr__(self, "setup", (self.setup,))
        if self.env is not None and not all(isinstance(k, str) and re.fullmatch(r"[A-Za-z_]\w*", k)
                                            for k in self.env):
            raise ValueError(f"env maps variable names to values, got {self.env!r}")
        if self.gpus_per_node is not None and self.ntasks_per_node not in (None, self.gpus_per_node):
            raise ValueError(f"one rank per GPU: ntasks_per_node={self.ntasks_per_node} with "
                             f"gpus_per_node={self.gpus_per_node}; leave ntasks_per_node out")

    @property
    def ranks_per_node(self) -> int:
        return self.gpus_per_node or self.ntasks_per_node or 1

    def check(self, expected_s: float | None = None) -> list[str]:
        """Why this target cannot take a job now, with the fix in words (empty: it can).
        ``expected_s``: the run's expected wall time (a plan's), which the time limit must cover."""
        if shutil.which("sbatch") is None:
            return ["no sbatch on the PATH: run where Slurm's commands are (a login node), or install "
                    "the client (Debian: apt-get install slurm-client)"]
        try:
            parts = partitions()
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
            return [str(e)]
        name = self.partition or next((p.name for p in parts.values() if p.default), None)
        if name not in parts:
            return [f"no partition {self.partition!r} on this cluster; it has {sorted(parts)}"
                    if self.partition else "this cluster names no default partition: pass partition="]
        p, out = parts[name], []
        if self.nodes > p.nodes:
            out.append(f"partition {name} has {p.nodes} node(s), the run asks for {self.nodes}: nodes<={p.nodes}")
        if self.gpus_per_node and not p.gpus_per_node:
            out.append(f"partition {name} lists no GPUs (gres): leave gpus_per_node out for a CPU run, or "
                       f"pick a partition with GPUs ({[q.name for q in parts.values() if q.gpus_per_node]})")
        elif self.gpus_per_node and self.gpus_per_node > p.gpus_per_node:
            out.append(f"partition {name} has {p.gpus_per_node} GPUs per node, the run asks for "
                       f"{self.gpus_per_node}: gpus_per_node<={p.gpus_per_node}")
        want_cpus = self.ranks_per_node * (self.cpus_per_task or 1)
        if p.cpus_per_node and want_cpus > p.cpus_per_node:
            out.append(f"partition {name} has {p.cpus_per_node} CPUs per node, the run asks for {want_cpus} "
                       f"({self.ranks_per_node} ranks x {self.cpus_per_task or 1} CPUs)")
        limit = time_seconds(self.time)
        if limit > p.time_limit_s:
            out.append(f"time={self.time} is past partition {name}'s limit ({p.time_limit_s:.0f} s)")
        if expected_s is not None and expected_s > limit:
            out.append(f"time={self.time} ({limit} s) is shorter than the run is expected to take "
                       f"({expected_s:.0f} s): ask for more time")
        return out

    def script(self, command: list[str], folder, name: str = "tunekit", comment: list[str] = ()) -> str:
        """The batch script that runs ``command`` once per rank under srun."""
        folder = Path(folder)
        opts = [f"--job-name={name}", f"--nodes={self.nodes}", f"--ntasks-per-node={self.ranks_per_node}",
                f"--time={self.time}", f"--output={folder}/slurm-%j.out"]
        for flag, v in (("partition", self.partition), ("gpus-per-node", self.gpus_per_node),
                        ("cpus-per-task", self.cpus_per_task), ("account", self.account), ("qos", self.qos),
                        ("constraint", self.constraint)):
            if v is not None:
                opts.append(f"--{flag}={v}")
        if self.gpus_per_node:
            opts.append("--gres-flags=enforce-binding")   # each task's CPUs on its GPU's NUMA node
        if self.exclusive:
            opts.append("--exclusive")
        lines = ["#!/bin/bash", *[f"#SBATCH {o}" for o in opts], *[f"# {c}" for c in comment],
                 "set -eo pipefail", *self.setup]
        lines += [f"export {k}={shlex.quote(str(v))}" for k, v in (self.env or {}).items()]
        lines += ['head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
                  'export MASTER_ADDR=$(scontrol show node "$head" | sed -n "s/.*NodeAddr=\\([^ ]*\\).*/\\1/p")',
                  "export MASTER_PORT=$((20000 + SLURM_JOB_ID % 20000))",
                  "srun --kill-on-bad-exit=1 " + " ".join(shlex.quote(c) for c in command), ""]
        return "\n".join(lines)

    def plan_script(self, plan, folder, **kw) -> Path:
        """`plan_script` on this target (what ``Plan.sbatch`` calls)."""
        return plan_script(self, plan, folder, **kw)

    def follow(self, job_id: str, folder, steps: int = 0) -> "SlurmJob":
        """A job submitted by hand (``sbatch folder/job.sh``) followed as if submitted here."""
        return SlurmJob(str(job_id), Path(folder).resolve(), self, steps)

    def submit(self, spec: dict, folder, name: str = "tunekit", comment: list[str] = ()) -> "SlurmJob":
        """Write ``spec`` and its batch script into ``folder`` (seen by every node) and submit it.
        Refuses (ValueError, nothing submitted) what ``check`` finds."""
        from tunekit.models.spec import check_model_spec
        from tunekit.parallel.worker import check_spec

        problems = check_spec({**spec, "nproc": self.ranks_per_node, "nodes": self.nodes}) or self.check()
        if problems:
            raise ValueError("; ".join(problems))
        check_model_spec(spec["model"])
        folder = Path(folder).resolve()
        folder.mkdir(parents=True, exist_ok=True)
        spec = {**spec, "nproc": self.ranks_per_node, "nodes": self.nodes, "out_dir": str(folder),
                "progress_file": str(folder / "progress"), "launched_at": time.time(),
                "error_dir": str(folder)}
        (folder / "spec.json").write_text(json.dumps(spec))
        path = folder / "job.sh"
        path.write_text(self.script([self.python, "-m", "tunekit.parallel.worker", str(folder / "spec.json")],
                                    folder, name, comment))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        out = subprocess.run(["sbatch", "--parsable", str(path)], capture_output=True, text=True, timeout=60, env=env)
        if out.returncode != 0:
            raise ValueError(f"sbatch refused the job: {out.stderr.strip()}")
        return SlurmJob(out.stdout.strip().split(";")[0], folder, self, spec.get("steps", 0))


def trainable_spec(model) -> dict:
    """The worker's model spec of what a plan planned: a GPT preset name, 'package.module:function',
    a transformers config (a dict with model_type, or a config object), a model instance, or a
    spec already made."""
    from tunekit.models.gpt import PRESETS
    from tunekit.models.spec import factory_spec, model_spec, source_spec

    if isinstance(model, dict) and "kind" in model:
        return model
    if isinstance(model, str):
        if model in PRESETS:
            return source_spec("preset", model)
        if model.count(":") == 1 and all(model.split(":")):
            return factory_spec(model)
        if model.endswith(".json") and Path(model).is_file():
            return source_spec("transformers", json.loads(Path(model).read_text()))
        raise ValueError(f"model={model!r} is not a preset ({', '.join(PRESETS)}), a transformers config .json "
                         "file or 'package.module:function'")
    from tunekit.models.gpt import GPTConfig

    if isinstance(model, GPTConfig):
        return {"kind": "gpt", "config": dataclasses.asdict(model)}
    if isinstance(model, dict) and "model_type" in model:
        return source_spec("transformers", model)
    if hasattr(model, "to_dict") and hasattr(model, "model_type"):
        return source_spec("transformers", model.to_dict())
    return model_spec(model)


def plan_script(target: Slurm, plan, folder, model=None, script: str | None = None, option=None,
                steps: int = 20, warmup: int = 2) -> Path:
    """Write ``folder/job.sh`` (and the spec it runs) for ``plan``'s setting, or for its advice's
    ``option`` (an index into ``plan.advice`` or one of its Options): the node and GPU request the
    setting needs, srun with NUMA binding, the tunekit worker training ``model`` (default: what the
    plan planned, where it can be rebuilt) for ``steps`` timed steps, or ``script`` (your own
    command: each task gets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT), and the
    plan's expected step as a comment. Returns the script's path; ``sbatch PATH`` submits it."""
    from dataclasses import fields as dc_fields

    whole("steps", steps)
    whole("warmup", warmup, 0)
    chosen = None
    if option is not None:
        chosen = plan.advice[option] if isinstance(option, int) else option
        if not hasattr(chosen, "setting"):
            raise ValueError(f"option is an index into plan.advice (0..{len(plan.advice) - 1}) or one of its "
                             f"Options, got {option!r}")
    setting = chosen.setting if chosen is not None else plan.setting
    expected = chosen.expected if chosen is not None else plan.expected
    world, nodes = setting.world_size or 1, setting.nodes or 1
    per_node = world // nodes
    gpu = plan.device.lower() not in ("cpu",)
    asked = {"nodes": target.nodes, "gpus_per_node" if gpu else "ntasks_per_node":
             target.gpus_per_node if gpu else target.ntasks_per_node}
    wanted = {"nodes": nodes, "gpus_per_node" if gpu else "ntasks_per_node": per_node}
    clash = [f"{k}={asked[k]} (the setting needs {v})" for k, v in wanted.items()
             if asked[k] not in (None, v) and not (k == "nodes" and asked[k] == 1)]
    if clash:
        raise ValueError(f"the target asks for {', '.join(clash)}: leave them out, the setting decides them")
    target = replace(target, nodes=nodes, **({"gpus_per_node": per_node} if gpu else {"ntasks_per_node": per_node}))
    folder = Path(folder).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    label = getattr(chosen, "label", "") or "as planned"
    comment = [f"tunekit plan: {plan.model} on {world} x {plan.device} ({nodes} node(s)), {label}"]
    if expected is not None and expected.step_s == expected.step_s:
        comment.append(f"expected step {expected.step_s * 1e3:.1f} ms, {expected.tokens_per_s:,.0f} tokens/s "
                       f"per {'GPU' if gpu else 'rank'}, MFU {expected.mfu:.0%} "
                       "(tunekit.plan's expectation: what a good run reaches)")
    else:
        comment.append("no expected step (a device figure is missing: see the plan's notes)")
    if script is not None:
        ranks = ("export RANK=$SLURM_PROCID WORLD_SIZE=$SLURM_NTASKS LOCAL_RANK=$SLURM_LOCALID "
                 f"LOCAL_WORLD_SIZE={per_node}; exec {script}")
        comment.append("your script: tunekit.Monitor(model, log_to=[...]) inside its loop measures each step")
        command = ["bash", "-c", ranks]
    else:
        toggle_names = {f.name for f in dc_fields(Toggles)}
        spec = {"model": trainable_spec(model if model is not None else
                                        getattr(plan, "model_spec", None) or setting.model or plan.model),
                "parallel": setting.parallel if world > 1 else None, "steps": steps, "warmup": warmup, "seed": 0,
                "toggles": {k: getattr(setting, k) for k in toggle_names}, "nproc": per_node, "nodes": nodes,
                "out_dir": str(folder), "progress_file": str(folder / "progress"), "error_dir": str(folder)}
        (folder / "spec.json").write_text(json.dumps(spec))
        command = [target.python, "-m", "tunekit.parallel.worker", str(folder / "spec.json")]
    path = folder / "job.sh"
    path.write_text(target.script(command, folder, "tunekit-plan", comment))
    return path


class JobFailed(RuntimeError):
    """A cluster job that ended without a result: ``.cause`` in words, ``.job`` (what Slurm said),
    ``.step_s`` the steps measured before it ended."""

    def __init__(self, cause: str, job: dict, step_s: list):
        self.cause, self.job, self.step_s = cause, job, step_s
        super().__init__(cause)


@dataclass
class SlurmJob:
    """One submitted job: ``info()`` what Slurm says now, ``wait()`` its RunResult, ``cancel()``."""

    job_id: str
    folder: Path
    target: Slurm
    steps: int
    shared_with: set = field(default_factory=set)   # other jobs seen on its nodes while it ran

    def info(self) -> dict:
        """``scontrol show job``'s fields (JobState, Reason, NodeList, ExitCode, ...); {} once Slurm
        has forgotten the job."""
        out = _run(["scontrol", "show", "job", "-o", self.job_id])
        if out.returncode != 0:
            return {}
        return dict(kv.split("=", 1) for kv in out.stdout.split() if "=" in kv)

    def state(self) -> str:
        return self.info().get("JobState", "UNKNOWN")

    def cancel(self, wait_s: float = 30.0) -> None:
        """scancel, then wait until squeue no longer lists it."""
        _run(["scancel", self.job_id])
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            out = _run(["squeue", "-h", "-j", self.job_id, "-o", "%T"])
            if out.returncode != 0 or not out.stdout.strip() or out.stdout.strip() in ENDED:
                return
            time.sleep(0.2)

    def step_s(self) -> list[float]:
        """Seconds of each timed step the job's rank 0 has reported so far (its progress file)."""
        try:
            lines = (self.folder / "progress").read_text().splitlines()
        except OSError:
            return []
        return [float(p[2]) for p in (line.split() for line in lines) if len(p) == 3]

    def wait(self, progress=None, on_state=None, poll_s: float = 0.5) -> RunResult:
        """Follow the job to its end. ``on_state(state, info)`` on each change of state (pending
        with its reason, running, ...); ``progress(done, total)`` as steps are reported. Ctrl-C
        cancels the job before KeyboardInterrupt goes on. Returns the RunResult (its ``job`` says
        where it ran); raises JobFailed with the cause in words, the steps measured so far kept."""
        last, seen, started = None, 0, time.monotonic()
        try:
            while True:
                info = self.info()
                state = info.get("JobState", "UNKNOWN")
                shown = (state, info.get("Reason"))
                if shown != last and on_state is not None:
                    on_state(state, info)
                last = shown
                if state == "PENDING" and self.target.start_timeout_s is not None \
                        and time.monotonic() - started > self.target.start_timeout_s:
                    self.cancel()
                    raise JobFailed(f"the job never started: pending ({info.get('Reason', '?')}) for "
                                    f"{self.target.start_timeout_s:.0f} s, then cancelled", self._job(info), [])
                if state == "RUNNING":
                    self._note_neighbours(info)
                times = self.step_s()
                if progress is not None and len(times) > seen:
                    for i in range(seen, len(times)):
                        progress(i + 1, self.steps)
                    seen = len(times)
                if state in ENDED or (not info and last is not None):
                    return self._finish(info)
                time.sleep(poll_s)
        except KeyboardInterrupt:
            self.cancel()
            raise

    def _note_neighbours(self, info: dict) -> None:
        nodes = info.get("NodeList")
        if not nodes or nodes == "(null)":
            return
        out = _run(["squeue", "-h", "-t", "RUNNING", "-w", nodes, "-o", "%i"])
        self.shared_with |= {j for j in out.stdout.split() if j != self.job_id}

    def _job(self, info: dict) -> dict:
        return {"engine": "slurm", "id": self.job_id, "partition": info.get("Partition", self.target.partition),
                "nodes": info.get("NodeList"), "state": info.get("JobState", "UNKNOWN"),
                "exit_code": info.get("ExitCode"), "folder": str(self.folder),
                "shared_with": sorted(self.shared_with)}

    def _finish(self, info: dict) -> RunResult:
        job = self._job(info)
        out = self.folder / "result.json"
        if job["state"] == "COMPLETED" and out.is_file():
            data = json.loads(out.read_text())
            result = RunResult.from_dict({**data, "job": job})
            if self.shared_with:   # the scheduler knows: a shared node is a busy machine
                why = f"node(s) {job['nodes']} shared with job(s) {', '.join(job['shared_with'])}"
                c = result.conditions
                result.conditions = (Conditions(BUSY, why) if c is None else
                                     replace(c, verdict=BUSY, reason=why + ("; " + c.reason if c.busy else "")))
                result.notes = [*result.notes, _shared_note(job)]
            return result
        raise JobFailed(self._cause(job), job, self.step_s())

    def _cause(self, job: dict) -> str:
        state = job["state"]
        if state == "COMPLETED":    # ended well, yet no result.json: not tunekit's worker
            return (f"the job completed without a tunekit result (a script of your own reports its own way: "
                    f"{self.folder}/slurm-{self.job_id}.out)")
        cause = CAUSES.get(state, f"the job ended {state}")
        if state == "TIMEOUT":
            cause += f" ({self.target.time})"
        errors = sorted(self.folder.glob("error-rank*.json"))
        if errors:
            first = min((json.loads(p.read_text()) for p in errors), key=lambda e: e.get("at", 0))
            cause += f": rank {first['rank']} on node {first['node']} failed:\n{first['traceback']}"
        elif state not in ("CANCELLED", "TIMEOUT", "PENDING"):
            log = self.folder / f"slurm-{self.job_id}.out"
            tail = log.read_text().strip().splitlines()[-5:] if log.is_file() else []
            if tail:
                cause += ": " + " / ".join(tail)
        done = len(self.step_s())
        return cause + f" (job {self.job_id} on {job['nodes']}; {done} of {self.steps} steps measured)"


def _shared_note(job: dict):
    from tunekit.core.notes import Note

    return Note("conditions.shared_node", f"node(s) {job['nodes']} ran other jobs ({', '.join(job['shared_with'])}) "
                                          "while this run measured: its figures are a busy machine's")


def from_slurm_env() -> None:
    """Under srun: the rank variables torch.distributed reads, from Slurm's (nothing set twice)."""
    if "SLURM_PROCID" not in os.environ or "RANK" in os.environ:
        return
    os.environ["RANK"] = os.environ["SLURM_PROCID"]
    os.environ["WORLD_SIZE"] = os.environ["SLURM_NTASKS"]
    os.environ["LOCAL_RANK"] = os.environ.get("SLURM_LOCALID", "0")
    per_node = re.match(r"\d+", os.environ.get("SLURM_NTASKS_PER_NODE", "")
                        or os.environ.get("SLURM_TASKS_PER_NODE", ""))
    if per_node:
        os.environ["LOCAL_WORLD_SIZE"] = per_node.group(0)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(20000 + int(os.environ.get("SLURM_JOB_ID", "0")) % 20000))


def write_rank_error(folder, rank: int, traceback: str) -> None:
    """A rank's traceback with its node, for the job's owner (read by SlurmJob's cause)."""
    Path(folder, f"error-rank{rank}.json").write_text(json.dumps(
        {"rank": rank, "node": os.environ.get("SLURMD_NODENAME", socket.gethostname()),
         "traceback": traceback, "at": time.time()}))
