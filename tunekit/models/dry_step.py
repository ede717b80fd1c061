"""One forward on a tiny batch before any training: refuses a ``batch_fn``/``loss_fn`` pair
that cannot make one loss, and changes nothing (buffers and every random stream are put back).
Models layer.
"""
from __future__ import annotations

import contextlib
import inspect
import random
import sys

import torch


def dry_step(model, batch_fn, loss_fn, micro_batch: int, seq_len: int, *, loss_name: str = "loss_fn",
             context=contextlib.nullcontext, generators=()) -> None:
    """One forward on a tiny batch, so that a ``batch_fn`` whose ``(x, y)`` the ``loss_fn`` cannot
    take, or a loss that is not one number, is refused (TypeError/ValueError saying what to fix)
    before any training. Runs under no_grad (and ``context()``, e.g. the run's autocast); the
    model's buffers (BatchNorm statistics) and every RNG (torch's, Python's, numpy's and the
    torch ``generators`` given) are put back, so later runs draw and compute what they would
    have without it. ``batch_fn`` is called once more than the runs ask."""
    _bindable("batch_fn", batch_fn, "(micro_batch, seq_len)", micro_batch, seq_len)
    device = next(iter(model.parameters()), torch.empty(0)).device
    saved_buffers = [b.detach().clone() for b in model.buffers()]
    py_rng, np_rng = random.getstate(), _numpy_rng()
    g_states = [g.get_state() for g in generators]
    cuda = [device.index if device.index is not None else torch.cuda.current_device()] if device.type == "cuda" else []
    try:
        with torch.random.fork_rng(devices=cuda, device_type="cuda"), torch.no_grad():
            try:
                batch = batch_fn(micro_batch, seq_len)
            except Exception as e:
                raise ValueError(f"batch_fn({micro_batch}, {seq_len}) raised {type(e).__name__}: {e} -- it must "
                                 "return (x, y) for micro_batch samples of seq_len tokens") from e
            if not isinstance(batch, (tuple, list)) or len(batch) != 2:
                raise TypeError(f"batch_fn must return a pair (x, y), got {_describe(batch)}")
            x, y = batch
            _bindable(loss_name, loss_fn, "(model, x, y)", model, x, y)
            try:
                with context():
                    loss = loss_fn(model, x, y)
            except Exception as e:
                raise ValueError(
                    f"{loss_name} failed on a batch of batch_fn({micro_batch}, {seq_len}) "
                    f"(x: {_describe(x)}, y: {_describe(y)}): {type(e).__name__}: {e} -- make batch_fn return "
                    "what the model takes (shape, dtype, device), or give a loss_fn that feeds it") from e
    finally:
        with torch.no_grad():
            for b, saved in zip(model.buffers(), saved_buffers):
                b.copy_(saved)
        random.setstate(py_rng)
        if np_rng is not None:
            sys.modules["numpy"].random.set_state(np_rng)
        for g, state in zip(generators, g_states):
            g.set_state(state)
    if not isinstance(loss, torch.Tensor):
        raise TypeError(f"{loss_name} must return the loss as a tensor with one element, got {_describe(loss)}")
    if loss.numel() != 1:
        raise ValueError(f"{loss_name} returned a tensor of shape {tuple(loss.shape)}, not one number: "
                         + ("give loss_fn=lambda model, x, y: ... that returns the loss" if loss_name != "loss_fn"
                            else "reduce it (e.g. .mean()) so that backward() has a scalar to start from"))
    if not loss.is_floating_point():
        raise TypeError(f"{loss_name} returned a {loss.dtype} tensor: backward() needs a floating-point loss")


def _bindable(name, fn, takes, *args) -> None:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):   # no signature to read (a builtin): the call will tell
        return
    try:
        sig.bind(*args)
    except TypeError:
        raise TypeError(f"{name} must take {takes}; its signature is {sig}") from None


def _numpy_rng():
    np = sys.modules.get("numpy")   # a batch_fn may draw from numpy's global RNG; never import it
    return np.random.get_state() if np is not None else None


def _describe(v) -> str:
    if isinstance(v, torch.Tensor):
        return f"Tensor {tuple(v.shape)} {str(v.dtype).replace('torch.', '')} on {v.device}"
    return f"{type(v).__name__} {v!r}"[:120]
