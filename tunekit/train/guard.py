"""The live model's guard: a run that goes non-finite is stopped and undone.

``Snapshot.take(lab)`` copies what a run can change (weights, optimizer state, the fp16
GradScaler) before the first step; ``restore()`` puts it back. On CUDA the copy goes to host
memory so the guard never competes with training for GPU memory. What it costs is measured
(``seconds``, ``bytes``) and recorded with the run.
"""
from __future__ import annotations

import time

import torch


class NonFiniteRunError(ValueError):
    """A run's loss or weights became NaN/inf; the run was stopped, recorded and undone.
    ``.result`` is the recorded (failed) RunResult."""

    def __init__(self, message: str, result=None):
        super().__init__(message)
        self.result = result


def _copy(obj, device):
    if isinstance(obj, torch.Tensor):
        return obj.detach().to(device, copy=True)
    if isinstance(obj, dict):
        return {k: _copy(v, device) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_copy(v, device) for v in obj)
    return obj


class Snapshot:
    """What a run of ``lab`` can change, copied: its weights, optimizer state and the fp16
    GradScaler's state (kept by ``lab.trainer``, train.TrainStep)."""

    def __init__(self, lab):
        t0 = time.perf_counter()
        self.lab = lab
        host = torch.device("cpu")
        self.params = [p.detach().to(host, copy=True) for p in lab.model.parameters()]
        self.optimizer = _copy(lab.optimizer.state_dict(), host) if lab.optimizer is not None else None
        self.scaler = lab.trainer.scaler_state()
        self.bytes = sum(p.numel() * p.element_size() for p in self.params) + sum(
            v.numel() * v.element_size() for st in (self.optimizer or {}).get("state", {}).values()
            for v in st.values() if isinstance(v, torch.Tensor))
        self.seconds = time.perf_counter() - t0

    @classmethod
    def take(cls, lab) -> "Snapshot":
        return cls(lab)

    def restore(self) -> None:
        lab = self.lab
        with torch.no_grad():
            for p, saved in zip(lab.model.parameters(), self.params):
                p.copy_(saved)
        lab.recover()   # gradients and a scaler left mid-step
        if self.optimizer is not None and lab.optimizer is not None:
            lab.optimizer.load_state_dict(self.optimizer)
        lab.trainer.load_scaler_state(self.scaler)


def finite(loss) -> bool:
    """Whether a step's loss is a finite number (after the step's clock: it syncs)."""
    return bool(torch.isfinite(loss).all())


def weights_finite(model) -> bool:
    """Whether every parameter is finite: one reduction per tensor, one sync."""
    flags = [torch.isfinite(p).all() for p in model.parameters()]
    return bool(torch.stack(flags).all()) if flags else True


class _NonFinite(Exception):
    """Raised inside a run at the first non-finite loss or weight (its text says which)."""


def _check(loss, what: str) -> None:
    if not finite(loss):
        raise _NonFinite(what)
