"""Start ranks on this machine under torch.distributed's elastic agent (the launcher torchrun
runs) and wait for them; a distributed Lab run (`launch`) and the all-reduce
benchmark (`tunekit.bench.allreduce`) both start their ranks here.

Each rank is a fresh interpreter (``python -m MODULE ARGS``, spawned: the kernel is never
forked) that rendezvouses on 127.0.0.1 through the agent's c10d store on a port the kernel
picks; the ranks' output goes to log files under ``work/logs``, never to pipes that could fill.
"""
from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import uuid
from pathlib import Path

from tunekit.core.paths import python_path

_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")


def run_ranks(world: int, module: str, args: list, work: Path, name: str, env: dict | None = None,
              join_timeout: float | None = None, agent_log: Path | None = None) -> None:
    """Run ``world`` ranks of ``python -m module *args`` and wait for them all.

    ``env``: variables the ranks need besides PYTHONPATH (always this process's sys.path); the
    agent hands the ranks this process's environment, so they are set here for the launch and
    put back after. ``join_timeout``: the rendezvous deadline in seconds. ``agent_log``: a file
    for the agent's own log records (else they go where logging sends them). A failed rank
    raises torch's ``ChildFailedError`` (the agent has stopped the others); Ctrl-C raises
    KeyboardInterrupt once the agent has stopped every rank. The signal handlers the agent
    installs are put back as they were."""
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    config = LaunchConfig(
        min_nodes=1, max_nodes=1, nproc_per_node=world, run_id=f"{name}-{uuid.uuid4().hex[:8]}",
        rdzv_backend="c10d", rdzv_endpoint="127.0.0.1:0",
        rdzv_configs={} if join_timeout is None else {"join_timeout": join_timeout},
        max_restarts=0, monitor_interval=0.1, start_method="spawn", shutdown_timeout=5,
        logs_specs=DefaultLogsSpecs(log_dir=str(work / "logs"), redirects=Std.ALL))
    saved = {s: signal.getsignal(getattr(signal, s)) for s in _SIGNALS if hasattr(signal, s)}
    extra = {**(env or {}), "PYTHONPATH": python_path()}
    old = {k: os.environ.get(k) for k in extra}
    os.environ.update(extra)
    try:
        with _agent_log(agent_log) if agent_log is not None else contextlib.nullcontext():
            elastic_launch(config, sys.executable)("-m", module, *args)
    except Exception as e:
        from torch.distributed.elastic.multiprocessing.api import SignalException

        if isinstance(e, SignalException) and e.sigval == signal.SIGINT:
            raise KeyboardInterrupt from None  # Ctrl-C: the agent has stopped every rank
        raise
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        if threading.current_thread() is threading.main_thread():
            for s, handler in saved.items():  # the agent installed its own; give back ours
                signal.signal(getattr(signal, s), handler)


@contextlib.contextmanager
def _agent_log(path: Path):
    """The elastic agent logs its own steps and a rank's death to stderr, which a notebook shows
    as an error even when the run is kept (a rank that died in its teardown, after the result
    was written). While it runs its records go to a file in the run's folder instead; what
    matters comes back as the run's notes or as the raised error."""
    handler = logging.FileHandler(path)
    saved = []
    for name in ("torch.distributed.elastic", "torch.distributed.launcher"):
        logger = logging.getLogger(name)
        saved.append((logger, logger.handlers[:], logger.propagate))
        logger.handlers, logger.propagate = [handler], False
    try:
        yield
    finally:
        for logger, handlers, propagate in saved:
            logger.handlers, logger.propagate = handlers, propagate
        handler.close()
