"""ClusterRun (lab.run(on=..., wait=False)) without a cluster: a job that ends when the test says,
the record step a list. The real job's side is tests/parallel/test_slurm.py's."""
import threading
import time

import pytest

from tunekit.core.results import RunResult
from tunekit.lab.cluster_run import ClusterRun
from tunekit.parallel.slurm_job import JobFailed


class HeldJob:
    """Runs on n0, reports step 1 of 3, then holds until `go` (or a cancel)."""

    job_id, steps = "7", 3

    def __init__(self, outcome=None):
        self.outcome, self.go, self.cancelled = outcome, threading.Event(), False

    def wait(self, progress=None, on_state=None, poll_s=0.5):
        on_state("RUNNING", {"NodeList": "n0", "JobId": self.job_id})
        progress(1, self.steps)
        assert self.go.wait(30)
        if self.cancelled:
            raise JobFailed("the job was cancelled (scancel, by you or an administrator)", {}, [0.1])
        if isinstance(self.outcome, BaseException):
            raise self.outcome
        return self.outcome

    def cancel(self, wait_s=30.0):
        self.cancelled = True
        self.go.set()


def follow(job):
    recorded = []

    def record(lab, job, sent, outcome):
        recorded.append(outcome)     # the Lab's log's RunResult is what the real one returns: not needed here
    return ClusterRun(lab=None, job=job, sent={}, record=record, verbose=False, poll_s=0.01), recorded


def test_the_handle_waits_then_gives_the_recorded_result():
    job = HeldJob(outcome=RunResult.from_dict({"label": "1x1 base", "status": "ok", "step_s": 0.5}))
    handle, recorded = follow(job)
    with pytest.raises(TimeoutError, match=r"^slurm job 7: running on n0, step 1/3: still going after 0.3 s"):
        handle.result(timeout=0.3)
    assert not handle.done() and recorded == []           # the job goes on: nothing recorded yet
    job.go.set()
    assert handle.result(timeout=30) is job.outcome and recorded == [job.outcome]   # recorded once
    assert handle.wait() is job.outcome and recorded == [job.outcome]               # not twice


def test_a_job_that_fails_is_recorded_and_raised_as_the_waited_form_does():
    failure = JobFailed("the job hit its time limit (1)", {}, [0.2, 0.3])
    job = HeldJob(outcome=failure)
    handle, recorded = follow(job)
    job.go.set()
    with pytest.raises(JobFailed) as e:
        handle.result(timeout=30)
    assert e.value is failure and recorded == [failure]


def test_a_cancelled_handle_is_not_recorded():
    job = HeldJob()
    handle, recorded = follow(job)
    handle.cancel()
    assert job.cancelled and handle.done() and recorded == []
    assert handle.line() == "slurm job 7: cancelled (not recorded)"
    with pytest.raises(JobFailed, match="the job was cancelled"):
        handle.result()


def test_a_watcher_hears_each_change_and_the_end_before_result_returns():
    job = HeldJob(outcome=RunResult.from_dict({"label": "1x1 base", "status": "ok", "step_s": 0.5}))
    handle, recorded = follow(job)
    heard = []
    deadline = time.monotonic() + 30
    while handle.steps_done < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    # registered while it runs: told the present at once (len(recorded): whether the end was recorded yet)
    handle.watch(lambda h, ended: heard.append((h.line(), ended, len(recorded))))
    assert heard == [("slurm job 7: running on n0, step 1/3", False, 0)]
    job.go.set()
    handle.result(timeout=30)
    assert [h[1:] for h in heard] == [(False, 0), (True, 1)]   # the end: after the record, before result()
    late = []
    handle.watch(lambda h, ended: late.append(ended))   # after the end: told once, that it ended
    assert late == [True] and handle.error is None and not handle.cancelled


def test_a_watcher_that_raises_does_not_stop_the_job_being_followed():
    job = HeldJob(outcome=JobFailed("the job hit its time limit (1)", {}, [0.2]))
    handle, recorded = follow(job)

    def broken(h, ended):
        raise RuntimeError("a widget went away")
    handle.watch(broken)
    job.go.set()
    with pytest.raises(JobFailed):
        handle.result(timeout=30)
    assert isinstance(handle.watch_error, RuntimeError) and handle.error is recorded[0]
