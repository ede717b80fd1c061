"""The test cluster (tools/slurm_cluster.py) is a real Slurm: a batch job's two tasks run through
srun, each with its Slurm rank, and nothing of the cluster is left running after `down`."""
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
import slurm_cluster  # noqa: E402

pytestmark = pytest.mark.skipif(slurm_cluster.missing() is not None,
                                reason=f"no test cluster here: {slurm_cluster.missing()}")


def _pids(folder: Path) -> list[int]:
    out = []
    for f in folder.glob("*.pid"):
        try:
            pid = int(f.read_text())
            os.kill(pid, 0)
            out.append(pid)
        except (OSError, ValueError):
            pass
    return out


def test_a_batch_job_runs_its_tasks_through_srun_and_down_leaves_nothing(tmp_path):
    folder = tmp_path / "slurm"
    with slurm_cluster.cluster(folder) as env:
        env = {**os.environ, **env}
        script = tmp_path / "job.sh"
        script.write_text("#!/bin/bash\n#SBATCH -n 2\n#SBATCH -o " + str(tmp_path / "out-%j.txt") + "\n"
                          "srun bash -c 'echo rank=$SLURM_PROCID of=$SLURM_NTASKS > "
                          + str(tmp_path) + "/rank-$SLURM_PROCID.txt'\n")
        job = subprocess.run(["sbatch", "--parsable", str(script)], env=env, capture_output=True,
                             text=True, check=True).stdout.strip()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            state = subprocess.run(["scontrol", "show", "job", job], env=env, capture_output=True, text=True).stdout
            if "JobState=COMPLETED" in state or "JobState=FAILED" in state:
                break
            time.sleep(0.3)
        assert "JobState=COMPLETED" in state, state
        assert [(tmp_path / f"rank-{r}.txt").read_text().split() for r in (0, 1)] == \
            [["rank=0", "of=2"], ["rank=1", "of=2"]]
        assert len(_pids(folder)) == 2       # slurmctld and slurmd while it is up
    assert _pids(folder) == []
