"""expected_run (what lab.run(on=...) checks the time limit against) on a Lab's log, no cluster needed."""
from types import SimpleNamespace

import torch

from tunekit.core.results import RunResult
from tunekit.lab.cluster import expected_run
from tunekit.parallel.slurm import Slurm


def run(run_id, step_s, device, job=None):
    return RunResult.from_dict({"label": "1x1", "status": "ok", "run_id": run_id, "step_s": step_s,
                                "device": device, "job": job, "micro_batch": 2})


def lab_with(*runs, device="cpu"):
    def no_plan(*a, **kw):
        raise AssertionError("a measured step comes first: no plan")
    return SimpleNamespace(log=SimpleNamespace(runs=list(runs)), device=torch.device(device), plan=no_plan)


def test_a_gpu_job_takes_only_a_step_measured_on_its_partition():
    here = run(0, 0.9, "NVIDIA A10G")                   # this machine's GPU: maybe slower than the cluster's
    lab = lab_with(here, device="cuda")
    gpu = Slurm(partition="gpu", gpus_per_node=8)
    assert expected_run(lab, gpu, here.toggles, 199, 1, None, 1) is None
    there = run(1, 0.2, "NVIDIA H100 80GB HBM3", job={"engine": "slurm", "partition": "gpu"})
    lab.log.runs.append(there)
    # (199 + 1 warm-up) steps x 0.2 s = 40 s
    assert expected_run(lab, gpu, here.toggles, 199, 1, None, 1) == \
        (40.0, "200 steps x 0.2 s, the step of run #1 on this setting on partition gpu")
    assert expected_run(lab, Slurm(partition="other", gpus_per_node=8), here.toggles, 199, 1, None, 1) is None


def test_a_cpu_job_from_a_cpu_lab_takes_the_last_step_measured_here():
    lab = lab_with(run(0, 0.7, "cpu (2 threads)"), run(1, 0.5, "cpu (2 threads)"))
    # (199 + 1) x 0.5 s = 100 s, run #1 the last on this setting
    assert expected_run(lab, Slurm(), lab.log.runs[0].toggles, 199, 1, None, 1) == \
        (100.0, "200 steps x 0.5 s, the step of run #1 on this setting here")
    # no run of 2 ddp ranks measured: the plan's figure, and a plan that cannot be made expects nothing
    assert expected_run(lab, Slurm(), lab.log.runs[0].toggles, 199, 1, "ddp", 2) is None
