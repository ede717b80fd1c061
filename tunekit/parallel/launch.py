"""Start a distributed run from this process and wait for its RunResult.

    >>> r = launch({"model": model_spec(model), "parallel": "fsdp", "toggles": {"micro_batch": 4},
    ...             "steps": 10}, nproc=2)
    >>> r.tokens_per_s, r.comm["by_kind"], r.peak_mem_bytes_per_rank

Without ``link`` every rank runs on this machine under torch.distributed's elastic agent (what
torchrun runs), each a fresh interpreter (``python -m tunekit.parallel.worker``): the kernel is never
forked. "Nodes" are then groups of ``nproc`` consecutive ranks. With ``link`` (e.g.
``{"bandwidth": "50mbit", "latency": "1ms"}``) each node gets its own network namespace joined
by an emulated link (tunekit.parallel.netns), and one ``torch.distributed.run`` per namespace.

A failure on any rank raises ``DistRunError`` naming the rank with its traceback; an error or
Ctrl-C leaves no worker behind (the agent terminates them; every process we started is waited
for), and the signal handlers the agent installs are put back as they were.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from tunekit.core.paths import python_path
from tunekit.core.results import RunResult
from tunekit.models.spec import check_model_spec
from tunekit.parallel.elastic import run_ranks
from tunekit.parallel.worker import check_spec


class DistRunError(RuntimeError):
    """A rank failed: ``.rank`` (the first to fail), ``.traceback`` (its Python traceback) and
    ``.failures`` (global rank -> message) say where and why."""

    def __init__(self, rank, traceback: str, failures: dict):
        self.rank, self.traceback, self.failures = rank, traceback, failures
        super().__init__(f"rank {rank} failed:\n{traceback}")


def _check(spec, nproc, nodes, link) -> None:
    if not isinstance(spec, dict):
        raise ValueError(f"a spec is a dict (see tunekit.parallel.worker), got {type(spec).__name__}")
    errors = check_spec({**spec, "nproc": nproc, "nodes": nodes})
    if link is not None and (not isinstance(link, dict) or set(link) - {"bandwidth", "latency"}):
        errors.append(f"link is a dict with bandwidth and/or latency, e.g. {{'bandwidth': '50mbit', "
                      f"'latency': '1ms'}}; got {link!r}")
    if errors:
        raise ValueError("; ".join(errors))
    check_model_spec(spec["model"])


def launch(spec: dict, nproc: int, nodes: int = 1, link=None, progress=None,
           keep_dir: bool = False) -> RunResult:
    """Run ``spec`` on ``nproc`` ranks per node x ``nodes`` nodes and return rank 0's RunResult.

    ``progress(done, total)`` is called (from a helper thread) as rank 0 finishes timed steps.
    Bad input raises ValueError before anything starts."""
    _check(spec, nproc, nodes, link)
    nproc, nodes = int(nproc), int(nodes)
    work = Path(tempfile.mkdtemp(prefix="tunekit-dist-"))
    spec = {**spec, "nproc": nproc, "nodes": nodes, "out_dir": str(work),
            "progress_file": str(work / "progress"), "launched_at": time.time()}
    stop = threading.Event()
    poller = threading.Thread(target=_poll, args=(work / "progress", progress, stop), daemon=True)
    poller.start()
    try:
        if link is None:
            _run_local({**spec, "gloo_ifname": spec.get("gloo_ifname", "lo")}, nproc * nodes, work)
        else:
            _run_netns(spec, nproc, nodes, link, work)
        stop.set()
        poller.join()
        out = work / "result.json"
        if not out.is_file():
            raise DistRunError(0, "the job ended without a result (rank 0 wrote none)", {})
        return RunResult.from_dict(json.loads(out.read_text()))
    finally:
        stop.set()
        if not keep_dir:
            shutil.rmtree(work, ignore_errors=True)


def _poll(path: Path, progress, stop: threading.Event) -> None:
    seen = 0
    while not stop.wait(0.2 if progress is not None else 3600):
        try:
            lines = path.read_text().splitlines()
        except OSError:
            continue
        for line in lines[seen:]:
            done, total = (int(v) for v in line.split()[:2])   # then that step's seconds
            progress(done, total)
        seen = len(lines)


def _write_spec(spec: dict, work: Path) -> Path:
    path = work / "spec.json"
    path.write_text(json.dumps(spec))
    return path


# --- all ranks here, under the elastic agent ------------------------------------------------


def _run_local(spec: dict, world: int, work: Path) -> None:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    path = _write_spec(spec, work)
    try:
        run_ranks(world, "tunekit.parallel.worker", [str(path)], work, "tunekit",
                  agent_log=work / "agent.log")
    except ChildFailedError as e:
        err = _failure(e.failures, work / "logs")
        if (work / "result.json").is_file() and not any(_python_traceback(f) for f in e.failures.values()):
            # every rank reached the end (rank 0 gathered their figures and wrote the result):
            # a rank that died at its exit (gloo has aborted in teardown) loses nothing
            _note_result(work, f"rank {err.rank} died after the run, in its teardown: {err.traceback}")
            return
        raise err from None


def _note_result(work: Path, note: str) -> None:
    out = work / "result.json"
    data = json.loads(out.read_text())
    data["notes"] = [*data.get("notes", []), note]
    out.write_text(json.dumps(data))


def _failure(failures: dict, logs: Path) -> DistRunError:
    """The first rank to fail (by time) with a Python traceback (from the error file @record
    wrote); a rank killed by a signal has none: the end of its stderr says what it printed."""
    msgs, with_tb = {}, []
    for rank, f in failures.items():
        tb = _python_traceback(f)
        if tb:
            msgs[rank] = tb
            with_tb.append(rank)
            continue
        msgs[rank] = f"exit code {f.exitcode} (no Python traceback: killed by a signal?)"
        tails = [p.read_text(errors="replace")[-3000:] for p in logs.rglob(f"{f.local_rank}/stderr.log")]
        if tails and tails[-1].strip():
            msgs[rank] += "; the end of its stderr:\n" + tails[-1]
    # ranks stopped because another failed carry no traceback, or one of a collective that lost its
    # peer: prefer a rank with a traceback of its own, then the first by time (seconds: ties happen)
    first = min(with_tb or failures, key=lambda r: (_lost_peer(msgs[r]), failures[r].timestamp, r))
    return DistRunError(first, msgs[first], msgs)


# how torch.distributed's backends say a peer went away: a rank failing so failed because of another
PEER_LOST = ("Connection closed by peer", "Connection reset by peer", "connectFullMesh failed", "Broken pipe",
             "NCCL communicator was aborted", "remote process exited or there was a network error")


def _lost_peer(traceback: str) -> bool:
    """Whether a rank's traceback is a collective that lost its peer (a consequence, not a cause)."""
    last = traceback.strip().splitlines()[-1] if traceback.strip() else ""
    return any(p in last for p in PEER_LOST)


def _python_traceback(f) -> str | None:
    data = f.error_file_data if isinstance(f.error_file_data, dict) else {}
    msg = data.get("message")
    if isinstance(msg, dict):
        return msg.get("extraInfo", {}).get("py_callstack") or msg.get("message")
    return None


# --- one torchrun per emulated node ---------------------------------------------------------


def _netns():
    from tunekit.parallel import netns  # the emulated nodes (another module); imported only when asked for

    return netns


def _run_netns(spec: dict, nproc: int, nodes: int, link: dict, work: Path) -> None:
    netns = _netns()
    why = netns.check()
    if why is not None:
        raise RuntimeError(f"emulated nodes are unavailable here: {why}")
    with netns.EmulatedNodes(nodes, bandwidth=link.get("bandwidth"), latency=link.get("latency")) as em:
        spec = {**spec, "gloo_ifname": em.ifname}
        path = _write_spec(spec, work)
        run_torchrun(em.addresses, [em.exec_prefix(i) for i in range(nodes)], nproc, path, work,
                     port=getattr(em, "port", 29517))


def run_torchrun(addresses: list, prefixes: list, nproc: int, spec_path: Path, work: Path,
                 port: int = 29517, timeout_s: float | None = None) -> None:
    """One ``python -m torch.distributed.run`` per node, node i started under ``prefixes[i]``
    (e.g. ``["ip", "netns", "exec", name]``) and meeting at ``addresses[0]:port``. Waits for all;
    a failing node stops the others; every process started is reaped. Raises DistRunError with
    the failing rank's traceback."""
    nodes = len(addresses)
    procs, logs = [], []
    env = dict(os.environ, PYTHONPATH=python_path())
    try:
        for i in range(nodes):
            err = work / f"node{i}"
            err.mkdir(exist_ok=True)
            log = open(work / f"node{i}.log", "wb")
            logs.append(log)
            argv = [*prefixes[i], sys.executable, "-m", "torch.distributed.run", "--nnodes", str(nodes),
                    "--node-rank", str(i), "--nproc-per-node", str(nproc), "--master-addr",
                    addresses[0], "--master-port", str(port), "--max-restarts", "0",
                    "--log-dir", str(err), "--redirects", "3",
                    "-m", "tunekit.parallel.worker", str(spec_path)]
            # own session: Ctrl-C reaches us, and we stop the nodes (not the other way round)
            procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env,
                                          start_new_session=True))
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while any(p.poll() is None for p in procs):
            if any(p.poll() not in (None, 0) for p in procs):
                break  # one node failed: stop the rest below
            if deadline is not None and time.monotonic() > deadline:
                break
            time.sleep(0.1)
        if any(p.returncode not in (0, None) for p in procs) or any(p.poll() is None for p in procs):
            _stop(procs)
            err = _netns_failure(work, nodes, nproc, procs)
            if err.rank is None and (work / "result.json").is_file():  # died in teardown only
                _note_result(work, f"a node ended badly after the run, in its teardown: {err.traceback}")
                return
            raise err
    finally:
        _stop(procs)
        for log in logs:
            log.close()


def _stop(procs) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)  # torchrun's agent stops its workers on SIGTERM
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def _netns_failure(work: Path, nodes: int, nproc: int, procs) -> DistRunError:
    """The traceback of the first rank whose error file (torchrun's --log-dir) holds one."""
    found = {}
    for i in range(nodes):
        for f in sorted((work / f"node{i}").rglob("error.json")):
            try:
                data = json.loads(f.read_text())
            except ValueError:
                continue
            local = int(f.parent.name) if f.parent.name.isdigit() else 0
            msg = data.get("message", {})
            tb = msg.get("extraInfo", {}).get("py_callstack") if isinstance(msg, dict) else None
            ts = int(msg.get("extraInfo", {}).get("timestamp", 0)) if isinstance(msg, dict) else 0
            found[i * nproc + local] = (ts, tb or str(msg))
    if not found:
        codes = ", ".join(f"node {i}: exit {p.returncode}" for i, p in enumerate(procs))
        tail = (work / "node0.log").read_text(errors="replace")[-2000:] if (work / "node0.log").exists() else ""
        return DistRunError(None, f"no rank left a traceback ({codes})\n{tail}", {})
    rank = min(found, key=lambda r: (_lost_peer(found[r][1]), found[r][0], r))
    return DistRunError(rank, found[rank][1], {r: v[1] for r, v in found.items()})
