"""A submitted Slurm job followed to its end: its state as Slurm says it (``scontrol``), the steps its
rank 0 reports (the progress file in its folder), Ctrl-C cancelling it, and every end without a
result a ``JobFailed`` with the cause in words. Engine (tunekit.parallel.slurm submits).
"""
from __future__ import annotations

import json
import subprocess
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from tunekit.core.conditions import BUSY, Conditions
from tunekit.core.results import RunResult

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

def _run(cmd: list[str], timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


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
    target: object        # the tunekit.parallel.slurm.Slurm that submitted it
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
            job["ranks"] = data.pop("ranks", None)   # each rank's node and CPUs (worker: what srun bound it to)
            result = RunResult.from_dict({**data, "job": job})
            if self.shared_with:   # the scheduler knows: a shared node is a busy machine
                why = f"node(s) {job['nodes']} shared with job(s) {', '.join(job['shared_with'])}"
                c = result.conditions
                result.conditions = (Conditions(BUSY, why) if c is None else
                                     replace(c, verdict=BUSY, reason=why + ("; " + c.reason if c.busy else "")))
                result.notes = [*result.notes, _shared_note(job)]
            return result
        raise JobFailed(self._cause(job, info.get("Reason")), job, self.step_s())

    def _cause(self, job: dict, reason: str | None = None) -> str:
        state = job["state"]
        if state == "COMPLETED":    # ended well, yet no result.json: not tunekit's worker
            return (f"the job completed without a tunekit result (a script of your own reports its own way: "
                    f"{self.folder}/slurm-{self.job_id}.out)")
        cause = CAUSES.get(state, f"the job ended {state}")
        if state == "TIMEOUT":
            cause += f" ({self.target.time})"
        failed = _failed_nodes(job["nodes"], drained=state == "NODE_FAIL") if state in ("NODE_FAIL", "FAILED") else []
        if failed:   # the scheduler's word on the node, first: a rank's error after it is a consequence
            cause = CAUSES["NODE_FAIL"] + ": " + ", ".join(failed)
        elif state == "NODE_FAIL" and reason not in (None, "None"):   # back in service already: Slurm's word
            cause += f" (Slurm: {reason})"
        errors = [] if failed else sorted(self.folder.glob("error-rank*.json"))
        if errors:
            first = min((json.loads(p.read_text()) for p in errors), key=lambda e: e.get("at", 0))
            cause += f": rank {first['rank']} on node {first['node']} failed:\n{first['traceback']}"
        elif state not in ("CANCELLED", "TIMEOUT", "PENDING") and not failed:
            log = self.folder / f"slurm-{self.job_id}.out"
            tail = log.read_text().strip().splitlines()[-5:] if log.is_file() else []
            if tail:
                cause += ": " + " / ".join(tail)
        done = len(self.step_s())
        return cause + f" (job {self.job_id} on {job['nodes']}; {done} of {self.steps} steps measured)"


def _failed_nodes(nodes: str | None, drained: bool = False) -> list[str]:
    """Which of a job's ``nodes`` (a Slurm host list, "n[0-1]") Slurm now holds down, failing or
    not responding (``drained``: drained or draining too), each with its reason:
    ["n1 down (Not responding)"]; [] when none or sinfo cannot say."""
    if not nodes or nodes == "(null)":
        return []
    try:
        out = _run(["sinfo", "-h", "-N", "-n", nodes, "-o", "%N|%T|%E"])
    except (OSError, subprocess.TimeoutExpired):
        return []
    found = []
    for line in sorted(set(out.stdout.splitlines())):
        name, state, slurm_says = (line.split("|", 2) + ["", ""])[:3]   # sinfo's %E: the admin's words, or "none"
        word = state.rstrip("*~#!%$@^-")
        if word.startswith(("down", "fail", "drain" if drained else "down")) or state.endswith("*"):
            said = word if not state.endswith("*") else f"{word}, not responding"
            found.append(f"{name} {said}" + (f" ({slurm_says})" if slurm_says not in ("", "none") else ""))
    return found


def _shared_note(job: dict):
    from tunekit.core.notes import Note

    return Note("conditions.shared_node", f"node(s) {job['nodes']} ran other jobs ({', '.join(job['shared_with'])}) "
                                          "while this run measured: its figures are a busy machine's")
