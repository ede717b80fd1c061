"""A real Slurm cluster on this machine, for tests, CI and chapters: Debian's slurmctld, slurmd and
munge, run as root without systemd, every file in one folder.

    python tools/slurm_cluster.py up --dir /tmp/slurm      # prints: export SLURM_CONF=/tmp/slurm/slurm.conf
    SLURM_CONF=/tmp/slurm/slurm.conf sbatch --wrap "srun -n2 hostname"
    python tools/slurm_cluster.py down --dir /tmp/slurm

    >>> with cluster(tmp) as env:        # in Python: {"SLURM_CONF": ...}, stopped on exit
    ...     subprocess.run(["sinfo"], env={**os.environ, **env})

One node (``n0``: this machine's CPUs and memory), one partition ``debug`` (the default). The
daemons' ports are picked free, so two clusters (two test runs) do not meet; munged is shared (one
per machine, started when absent, left running: other clusters may use it). What works here and
why (``ProctrackType=proctrack/linuxproc``, ``TaskPlugin=task/none``: no systemd, no cgroup
delegation in a container) follows Slurm's slurm.conf(5). Needs root and the packages:
``apt-get install slurmctld slurmd slurm-client munge`` (Debian 12 ships Slurm 22.05).
"""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

NEEDS = ("slurmctld", "slurmd", "sbatch", "srun", "squeue", "sinfo", "scontrol", "munged")
MUNGE_SOCKET = Path("/run/munge/munge.socket.2")
PARTITION = "debug"
NODE = "n0"


def missing() -> str | None:
    """Why a cluster cannot start here, or None."""
    absent = [b for b in NEEDS if shutil.which(b) is None and not Path("/usr/sbin", b).exists()]
    if absent:
        return (f"no {', '.join(absent)} on this machine: apt-get install slurmctld slurmd slurm-client munge "
                f"(as root)")
    if os.geteuid() != 0:
        return "starting slurmctld and slurmd needs root (they run as root here, without systemd)"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _bin(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


def _munge() -> None:
    """munged as the munge user, once per machine (its key comes with the package)."""
    if MUNGE_SOCKET.exists():
        probe = subprocess.run(["munge", "-n"], capture_output=True)
        if probe.returncode == 0:
            return
    MUNGE_SOCKET.parent.mkdir(parents=True, exist_ok=True)
    shutil.chown(MUNGE_SOCKET.parent, "munge", "munge")
    subprocess.run(["runuser", "-u", "munge", "--", _bin("munged"), "--force"], check=True)
    for _ in range(50):
        if MUNGE_SOCKET.exists():
            return
        time.sleep(0.1)
    raise RuntimeError("munged did not start: see /var/log/munge/munged.log")


def config(folder: Path, cpus: int, memory_mb: int, ports: tuple[int, int]) -> str:
    host = socket.gethostname()
    # more CPUs than the machine has (tests that need two jobs side by side): slurmd takes the
    # configured count instead of draining the node for "Low socket*core*thread count"
    overrides = ["SlurmdParameters=config_overrides"] if cpus > (os.cpu_count() or 1) else []
    return "\n".join([*overrides,
        "ClusterName=tunekit",
        f"SlurmctldHost={host}(127.0.0.1)",
        "SlurmUser=root", "SlurmdUser=root", "AuthType=auth/munge",
        f"SlurmctldPort={ports[0]}", f"SlurmdPort={ports[1]}",
        f"StateSaveLocation={folder}/state", f"SlurmdSpoolDir={folder}/spool-%n",
        f"SlurmctldPidFile={folder}/slurmctld.pid", f"SlurmdPidFile={folder}/slurmd-%n.pid",
        f"SlurmctldLogFile={folder}/slurmctld.log", f"SlurmdLogFile={folder}/slurmd-%n.log",
        "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
        "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core_Memory",
        "MpiDefault=none", "ReturnToService=2", "MinJobAge=600",
        f"DefMemPerCPU={memory_mb // cpus}",   # else a job takes the whole node's memory, and no job runs beside it
        "SlurmctldTimeout=30", "SlurmdTimeout=30", "InactiveLimit=0", "KillWait=5",
        f"NodeName={NODE} NodeHostname={host} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={memory_mb} State=UNKNOWN",
        f"PartitionName={PARTITION} Nodes={NODE} Default=YES MaxTime=INFINITE State=UP",
        "",
    ])


def up(folder, cpus: int | None = None, timeout_s: float = 30.0) -> dict:
    """Start a one-node cluster whose files live in ``folder``; returns the environment its clients
    need (``{"SLURM_CONF": ...}``) once the node is idle. ``cpus``: the node's CPUs as Slurm
    allocates them (default this machine's; more lets tests run jobs side by side)."""
    why = missing()
    if why:
        raise RuntimeError(why)
    folder = Path(folder).resolve()
    (folder / "state").mkdir(parents=True, exist_ok=True)
    memory_mb = int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**20 * 0.8)
    conf = folder / "slurm.conf"
    conf.write_text(config(folder, cpus or os.cpu_count() or 1, memory_mb, (_free_port(), _free_port())))
    env = {"SLURM_CONF": str(conf)}
    _munge()
    full = {**os.environ, **env}
    subprocess.run([_bin("slurmctld"), "-f", str(conf)], check=True, env=full)
    subprocess.run([_bin("slurmd"), "-f", str(conf), "-N", NODE], check=True, env=full)
    deadline = time.monotonic() + timeout_s
    state = ""
    while time.monotonic() < deadline:
        out = subprocess.run(["sinfo", "-h", "-n", NODE, "-o", "%T"], capture_output=True, text=True, env=full)
        state = out.stdout.strip()
        if state == "idle":
            return env
        time.sleep(0.3)
    down(folder)
    raise RuntimeError(f"the node did not become idle in {timeout_s:.0f} s (state {state!r}); "
                       f"see {folder}/slurmctld.log and {folder}/slurmd-{NODE}.log")


def down(folder) -> None:
    """Cancel every job of this cluster and stop its daemons (munged stays: it is shared)."""
    folder = Path(folder).resolve()
    env = {**os.environ, "SLURM_CONF": str(folder / "slurm.conf")}
    if (folder / "slurm.conf").exists():
        subprocess.run(["scancel", "--full", "--quiet", "-p", PARTITION], env=env, capture_output=True, timeout=30)
    for pidfile in [folder / f"slurmd-{NODE}.pid", folder / "slurmctld.pid"]:
        try:
            pid = int(pidfile.read_text().strip())
        except (OSError, ValueError):
            continue
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            continue
        for _ in range(100):
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        else:
            os.kill(pid, signal.SIGKILL)


@contextmanager
def cluster(folder, cpus: int | None = None):
    """``up`` on entry, ``down`` on exit (also after an error or Ctrl-C)."""
    try:
        yield up(folder, cpus)
    finally:
        down(folder)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("action", choices=("up", "down", "check"))
    ap.add_argument("--dir", default="build/slurm", help="the cluster's folder (config, state, logs)")
    args = ap.parse_args(argv)
    if args.action == "check":
        why = missing()
        print(why or "ready: slurmctld, slurmd, munged and the clients are here")
        return 1 if why else 0
    if args.action == "down":
        down(args.dir)
        return 0
    env = up(args.dir)
    print(f"export SLURM_CONF={env['SLURM_CONF']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
