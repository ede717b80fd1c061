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
ends the job when one rank dies), and binds each task to cores of its own (``--cpu-bind=cores``),
spread over the node's sockets (``--ntasks-per-socket``) and near its GPU
(``--gres-flags=enforce-binding``), as the documents this project mirrors recommend (`Slurm.script`).
Each rank's node and CPUs come home in ``result.job["ranks"]``.

Another engine (Kubernetes, SkyPilot) is one more class with the same three methods: ``check``,
``script``/``submit``, and a job with ``info``, ``wait`` and ``cancel``.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from tunekit.core.paths import python_path
from tunekit.core.validate import whole
from tunekit.parallel.slurm_job import ENDED, JobFailed, SlurmJob, _run  # noqa: F401  (re-exported)

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


# a port free on the head node, below Linux's ephemeral range (ip_local_port_range, 32768-60999 by
# default): one the kernel handed out for bind(0) is in that range, where any outgoing connection of
# the node may take it before rank 0 listens (EADDRINUSE seen so on a busy machine)
_FREE_PORT = """import random, socket
for port in random.sample(range(20000, 32768), 500):
    with socket.socket() as s:
        try:
            s.bind(("", port))
        except OSError:
            continue
        print(port)
        break
"""

@dataclass(frozen=True)
class Partition:
    """What ``sinfo`` says of one partition."""

    name: str
    nodes: int
    cpus_per_node: int
    gpus_per_node: int          # 0: the partition's nodes list no GPU resource (gres)
    time_limit_s: float         # inf: no limit
    default: bool = False
    sockets_per_node: int = 1   # sinfo's %X: where > 1, a job's tasks are spread over them (--ntasks-per-socket)


def partitions() -> dict[str, Partition]:
    """Every partition of the cluster ``sinfo`` reaches (SLURM_CONF, else the machine's)."""
    out = _run(["sinfo", "-h", "-o", "%P|%D|%c|%G|%l|%X"])
    if out.returncode != 0:
        raise RuntimeError(f"sinfo could not reach the cluster: {out.stderr.strip() or out.stdout.strip()}")
    found = {}
    for line in out.stdout.splitlines():
        name, nodes, cpus, gres, limit, sockets = (line.split("|") + ["1"])[:6]
        default = name.endswith("*")
        name = name.rstrip("*")
        gpus = sum(int(n) for n in re.findall(r"gpu(?::[\w.-]+)?:(\d+)", gres))
        seconds = float("inf") if limit in ("infinite", "UNLIMITED", "n/a") else time_seconds(limit)
        cpus = int(re.sub(r"\D.*", "", cpus) or 0)
        old = found.get(name)
        nodes_n = int(nodes) + (old.nodes if old else 0)   # one line per node state: summed
        sockets_n = int(re.sub(r"\D.*", "", sockets) or 1)   # "2+": nodes differ, the fewest said first
        found[name] = Partition(name, nodes_n, cpus, gpus, seconds, default or (old.default if old else False),
                                min(sockets_n, old.sockets_per_node) if old else sockets_n)
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
    ranks run (default this one: a cluster whose nodes see this machine's paths). ``folder``: where
    job folders go, seen by every node (default tunekit's data folder, core.paths.jobs_dir).

    Example: ``lab.run(steps=20, parallel="fsdp", on=tunekit.Slurm(partition="gpu", nodes=2, gpus_per_node=8))``."""

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
    folder: str | None = None

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
        if self.folder is not None and not isinstance(self.folder, (str, os.PathLike)):
            raise ValueError(f"folder is a path every node sees, got {self.folder!r}")
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

    def check(self, expected_s: float | None = None, basis: str | None = None) -> list[str]:
        """Why this target cannot take a job now, with the fix in words (empty: it can).
        ``expected_s``: the run's expected wall time (a plan's), which the time limit must cover;
        ``basis``: what that figure comes from, in words ("20 steps x 45 s, ...")."""
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
                       f"({expected_s:.0f} s{': ' + basis if basis else ''}): ask for more time")
        return out

    def sockets(self) -> int | None:
        """Sockets per node of the target's partition as ``sinfo`` says (None: no cluster reached)."""
        if shutil.which("sinfo") is None:
            return None
        try:
            parts = partitions()
        except (RuntimeError, OSError, subprocess.TimeoutExpired):
            return None
        name = self.partition or next((p.name for p in parts.values() if p.default), None)
        return parts[name].sockets_per_node if name in parts else None

    def script(self, command: list[str], folder, name: str = "tunekit", comment: list[str] = (),
               sockets: int | None = None) -> str:
        """The batch script that runs ``command`` once per rank under srun. ``sockets``: the
        partition's sockets per node (`sockets`); where more than one, the ranks of a node are
        spread over them (``--ntasks-per-socket``).

        NUMA binding, as srun(1) and sbatch(1) put it: each task gets an equal share of the CPUs the
        job holds on its node (``--cpus-per-task``, unless the target sets it) and is bound to those
        cores (``--cpu-bind=cores``; the task/affinity plugin applies it, a cluster without it runs
        the tasks unbound); ``--ntasks-per-socket`` spreads a node's tasks over its sockets, and
        with GPUs ``--gres-flags=enforce-binding`` gives the job only the CPUs bound to its GPUs."""
        folder = Path(folder)
        opts = [f"--job-name={name}", f"--nodes={self.nodes}", f"--ntasks-per-node={self.ranks_per_node}",
                f"--time={self.time}", f"--output={folder}/slurm-%j.out"]
        if sockets and sockets > 1:
            opts.append(f"--ntasks-per-socket={-(-self.ranks_per_node // sockets)}")   # ceil: every rank placed
        for flag, v in (("partition", self.partition), ("gpus-per-node", self.gpus_per_node),
                        ("cpus-per-task", self.cpus_per_task), ("account", self.account), ("qos", self.qos),
                        ("constraint", self.constraint)):
            if v is not None:
                opts.append(f"--{flag}={v}")
        if self.gpus_per_node:
            opts.append("--gres-flags=enforce-binding")   # each task's CPUs on its GPU's NUMA node
        if self.exclusive:
            opts.append("--exclusive")
        opts.append("--no-requeue")   # a node that fails ends the run, recorded: not started again later
        # each task its share of the node's CPUs the job holds (srun does not take sbatch's --cpus-per-task
        # from the environment in every Slurm release: said to srun itself)
        cpus = self.cpus_per_task or f"$((SLURM_CPUS_ON_NODE / {self.ranks_per_node}))"
        lines = ["#!/bin/bash", *[f"#SBATCH {o}" for o in opts], *[f"# {c}" for c in comment],
                 "set -eo pipefail", *self.setup]
        lines += [f"export {k}={shlex.quote(str(v))}" for k, v in (self.env or {}).items()]
        lines += ['head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
                  'export MASTER_ADDR=$(scontrol show node "$head" | sed -n "s/.*NodeAddr=\\([^ ]*\\).*/\\1/p")',
                  # a port free on the head node now (the batch step runs there): one derived from the
                  # job id collides when two clusters' job 1 share a host (CI failed so once)
                  f"export MASTER_PORT=$({shlex.quote(self.python)} -c {shlex.quote(_FREE_PORT)} 2>/dev/null"
                  " || echo $((20000 + RANDOM % 20000)))",
                  f"srun --kill-on-bad-exit=1 --cpus-per-task={cpus} --cpu-bind=cores "
                  + " ".join(shlex.quote(c) for c in command), ""]
        return "\n".join(lines)

    def plan_script(self, plan, folder, **kw) -> Path:
        """`tunekit.parallel.slurm_script.plan_script` on this target (what ``Plan.sbatch`` calls)."""
        from tunekit.parallel.slurm_script import plan_script

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
                                    folder, name, comment, sockets=self.sockets()))
        env = {**os.environ, "PYTHONPATH": python_path()}
        out = subprocess.run(["sbatch", "--parsable", str(path)], capture_output=True, text=True, timeout=60, env=env)
        if out.returncode != 0:
            raise ValueError(f"sbatch refused the job: {out.stderr.strip()}")
        return SlurmJob(out.stdout.strip().split(";")[0], folder, self, spec.get("steps", 0))


def job_folder(target: Slurm, name: str) -> Path:
    """A new folder for one job under the target's folder (default core.paths.jobs_dir)."""
    from tunekit.core import paths

    base = Path(target.folder).expanduser() if target.folder else paths.jobs_dir()
    base.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=time.strftime(f"{name}-%Y%m%d-%H%M%S-"), dir=base))
