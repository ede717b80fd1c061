"""A real Slurm cluster on this machine, for tests, CI and chapters: Debian's slurmctld, slurmd and
munge, run as root without systemd, every file in one folder.

    python tools/slurm_cluster.py up --dir /tmp/slurm      # prints: export SLURM_CONF=/tmp/slurm/slurm.conf
    SLURM_CONF=/tmp/slurm/slurm.conf sbatch --wrap "srun -n2 hostname"
    python tools/slurm_cluster.py down --dir /tmp/slurm
    python tools/slurm_cluster.py up --nodes 2 --dir /tmp/s2   # two nodes, until Ctrl-C

    >>> with cluster(tmp) as env:        # in Python: {"SLURM_CONF": ...}, stopped on exit
    ...     subprocess.run(["sinfo"], env={**os.environ, **env})

One node (``n0``: this machine's CPUs and memory), or several (``n0``, ``n1``, ...: one network
namespace each, joined by the project's emulated link; the Slurm commands then run in n0's
namespace, as on a login node, through wrappers on the PATH it returns); one partition ``debug``. The
daemons' ports are picked free, so two clusters (two test runs) do not meet; munged is shared (one
per machine, started when absent, left running: other clusters may use it). What works here and
why (``ProctrackType=proctrack/linuxproc``: no systemd, no cgroup delegation in a container;
``TaskPlugin=task/affinity``: srun's ``--cpu-bind`` binds with sched_setaffinity, no cgroup needed;
``task/none`` where ``cpus`` is more than the machine has, since no task can be bound to a CPU
that is not there: srun says "cluster configuration lacks support for cpu binding" and runs the
tasks unbound) follows Slurm's slurm.conf(5). Needs root and the packages:
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


def config(folder: Path, cpus: int, memory_mb: int, ports: tuple[int, int], addresses: list[str]) -> str:
    """slurm.conf for one node per address: n0 (the controller's too), n1, ..."""
    host = socket.gethostname() if len(addresses) == 1 else "n0"
    # more CPUs than the machine has (tests that need two jobs side by side): slurmd takes the
    # configured count instead of draining the node for "Low socket*core*thread count"
    overrides = ["SlurmdParameters=config_overrides"] if cpus > (os.cpu_count() or 1) else []
    # tasks bound to their cores (srun --cpu-bind) where the CPUs are real; CPUs the machine lacks
    # cannot be bound to (srun: "Unable to layout tasks on given cpus"): there tasks run unbound
    task = "task/none" if overrides else "task/affinity"
    names = [f"n{i}" for i in range(len(addresses))]
    hosts = [host] if len(addresses) == 1 else names
    return "\n".join([*overrides,
        "ClusterName=tunekit",
        f"SlurmctldHost={host}({addresses[0]})",
        "SlurmUser=root", "SlurmdUser=root", "AuthType=auth/munge",
        f"SlurmctldPort={ports[0]}", f"SlurmdPort={ports[1]}",
        f"StateSaveLocation={folder}/state", f"SlurmdSpoolDir={folder}/spool-%n",
        f"SlurmctldPidFile={folder}/slurmctld.pid", f"SlurmdPidFile={folder}/slurmd-%n.pid",
        f"SlurmctldLogFile={folder}/slurmctld.log", f"SlurmdLogFile={folder}/slurmd-%n.log",
        "ProctrackType=proctrack/linuxproc", f"TaskPlugin={task}",
        "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core_Memory",
        "MpiDefault=none", "MinJobAge=600",
        # a node that stops answering comes back when its slurmd registers again; one an admin (or a
        # test) sets down stays down, its reason said by sinfo, until `scontrol update state=resume`
        "ReturnToService=1",
        f"DefMemPerCPU={memory_mb // cpus}",   # else a job takes the whole node's memory, and no job runs beside it
        "SlurmctldTimeout=30", "SlurmdTimeout=30", "InactiveLimit=0", "KillWait=5",
        *[f"NodeName={n} NodeHostname={h} NodeAddr={a} CPUs={cpus} RealMemory={memory_mb} State=UNKNOWN"
          for n, h, a in zip(names, hosts, addresses)],
        f"PartitionName={PARTITION} Nodes={','.join(names)} Default=YES MaxTime=INFINITE State=UP",
        "",
    ])


def up(folder, cpus: int | None = None, namespaces: list[str] | None = None, addresses: list[str] | None = None,
       timeout_s: float = 30.0) -> dict:
    """Start a cluster whose files live in ``folder``; returns the environment its clients need
    (``SLURM_CONF``; with namespaces, a ``PATH`` whose Slurm commands run in the first node's
    namespace, as on a login node) once every node is idle. ``cpus``: each node's CPUs as Slurm
    allocates them (default this machine's; more lets tests run jobs side by side).
    ``namespaces``/``addresses``: one network namespace (/run/netns/NAME) and address per node,
    e.g. tunekit.parallel.netns.EmulatedNodes' (see `cluster`); None: one node on 127.0.0.1."""
    why = missing()
    if why:
        raise RuntimeError(why)
    folder = Path(folder).resolve()
    (folder / "state").mkdir(parents=True, exist_ok=True)
    n = len(namespaces) if namespaces else 1
    memory_mb = int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**20 * 0.8 / n)
    conf = folder / "slurm.conf"
    conf.write_text(config(folder, cpus or os.cpu_count() or 1, memory_mb, (_free_port(), _free_port()),
                           addresses or ["127.0.0.1"]))
    env = {"SLURM_CONF": str(conf)}
    _munge()
    if namespaces:
        env["PATH"] = _login_node(folder, namespaces[0]) + os.pathsep + os.environ.get("PATH", "")
    full = {**os.environ, **env}
    names = [f"n{i}" for i in range(n)]
    if not namespaces:
        subprocess.run([_bin("slurmctld"), "-f", str(conf)], check=True, env=full)
        subprocess.run([_bin("slurmd"), "-f", str(conf), "-N", NODE], check=True, env=full)
    else:   # each daemon inside its node's network namespace, under that node's own hostname
        def inside(ns, name, *cmd):
            subprocess.run(["nsenter", f"--net=/run/netns/{ns}", "unshare", "--uts", "sh", "-c",
                            f"hostname {name} && exec " + " ".join(cmd)], check=True, env=full)
        inside(namespaces[0], "n0", _bin("slurmctld"), "-f", str(conf))
        for ns, name in zip(namespaces, names):
            inside(ns, name, _bin("slurmd"), "-f", str(conf), "-N", name)
    deadline = time.monotonic() + timeout_s
    states = []
    while time.monotonic() < deadline:
        out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], capture_output=True, text=True, env=full)
        states = sorted(out.stdout.split("\n")[:-1]) if out.returncode == 0 else []
        if states == [f"{name} idle" for name in names]:
            return env
        time.sleep(0.3)
    down(folder)
    raise RuntimeError(f"the nodes did not become idle in {timeout_s:.0f} s ({states}); "
                       f"see {folder}/slurmctld.log and {folder}/slurmd-n*.log")


def _login_node(folder: Path, namespace: str) -> str:
    """A folder of the Slurm commands, each run inside ``namespace`` (where the controller is)."""
    bin_dir = folder / "bin"
    bin_dir.mkdir(exist_ok=True)
    for cmd in ("sbatch", "srun", "squeue", "scontrol", "scancel", "sinfo"):
        path = bin_dir / cmd
        path.write_text(f'#!/bin/sh\nexec nsenter --net=/run/netns/{namespace} {shutil.which(cmd)} "$@"\n')
        path.chmod(0o755)
    return str(bin_dir)


def down(folder) -> None:
    """Cancel every job of this cluster and stop its daemons (munged stays: it is shared)."""
    folder = Path(folder).resolve()
    env = {**os.environ, "SLURM_CONF": str(folder / "slurm.conf")}
    if (folder / "bin").is_dir():
        env["PATH"] = str(folder / "bin") + os.pathsep + env.get("PATH", "")
    if (folder / "slurm.conf").exists():
        subprocess.run(["scancel", "--full", "--quiet", "-p", PARTITION], env=env, capture_output=True, timeout=30)
    for pidfile in [*folder.glob("slurmd-*.pid"), folder / "slurmctld.pid"]:
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
def cluster(folder, cpus: int | None = None, nodes: int = 1, bandwidth: str = "1gbit", latency: str = "0.1ms"):
    """``up`` on entry, ``down`` on exit (also after an error or Ctrl-C). ``nodes`` > 1: one network
    namespace per node joined by an emulated ``bandwidth``/``latency`` link
    (tunekit.parallel.netns.EmulatedNodes), one slurmd in each; the ranks meet over ``tk0``."""
    if nodes == 1:
        try:
            yield up(folder, cpus)
        finally:
            down(folder)
        return
    from tunekit.parallel.netns import EmulatedNodes

    with EmulatedNodes(nodes, bandwidth=bandwidth, latency=latency) as net:
        try:
            yield up(folder, cpus, net.names, net.addresses)
        finally:
            down(folder)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("action", choices=("up", "down", "check"))
    ap.add_argument("--dir", default="build/slurm", help="the cluster's folder (config, state, logs)")
    ap.add_argument("--nodes", type=int, default=1, help="nodes (> 1: one network namespace each; "
                    "the cluster then lives while this command runs, Ctrl-C stops it)")
    ap.add_argument("--cpus", type=int, default=None, help="CPUs per node as Slurm allocates them")
    args = ap.parse_args(argv)
    if args.action == "check":
        why = missing()
        print(why or "ready: slurmctld, slurmd, munged and the clients are here")
        return 1 if why else 0
    if args.action == "down":
        down(args.dir)
        return 0
    if args.nodes == 1:
        env = up(args.dir, args.cpus)
        print(f"export SLURM_CONF={env['SLURM_CONF']}")
        return 0
    signal.signal(signal.SIGTERM, lambda *a: (_ for _ in ()).throw(KeyboardInterrupt))
    with cluster(args.dir, args.cpus, args.nodes) as env:
        print(" ".join(f"export {k}={v}" for k, v in env.items()), flush=True)
        print(f"{args.nodes} nodes up; Ctrl-C stops them", flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
