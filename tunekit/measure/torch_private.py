"""Every private torch API tunekit relies on, in one place. Measurement layer.

torch offers no public way to do these few things; each is wrapped here so that a torch upgrade
that changes one breaks exactly one function, and tests/measure/test_canaries.py (the canary) fails
loudly naming it, instead of a measurement going silently wrong.
"""
from __future__ import annotations

import contextlib
import inspect
import sys

import torch
from torch.utils.flop_counter import FlopCounterMode

# FlopCounterMode calls this method once per executed op with (func_packet, out, args, kwargs);
# tunekit.measure.flops.TunekitFlopCounter overrides it to add formulas torch lacks, halve causal
# attention and split out recomputation. torch's public hook, `custom_mapping`, can only add
# formulas: it sees neither the grad mode nor the caller's module.
COUNT_HOOK = "_count_flops"
COUNT_HOOK_PARAMS = ("self", "func_packet", "out", "args", "kwargs")


def count_hook_signature() -> tuple:
    """The parameter names of FlopCounterMode's per-op hook in this torch."""
    return tuple(inspect.signature(getattr(FlopCounterMode, COUNT_HOOK)).parameters)


_STACK: list = []  # (its length, the stack): torch's functions, looked up once


def dispatch_mode_stack() -> list:
    """The torch dispatch modes now active (innermost last). Asked before and after every
    profiled cell: an empty stack (the usual case) is told by its length alone, without an import
    statement or a list per call."""
    if not _STACK:
        from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

        _STACK.append((getattr(torch._C, "_len_torch_dispatch_stack", None), _get_current_dispatch_mode_stack))
    length, stack = _STACK[0]
    if length is not None and length() == 0:
        return []
    return list(stack())


def is_flop_counter(mode) -> bool:
    """True for a FlopCounterMode on the dispatch stack: torch >= 2.5 pushes a private
    `_FlopCounterMode` helper there, older versions the FlopCounterMode itself."""
    return isinstance(mode, FlopCounterMode) or type(mode).__name__ == "_FlopCounterMode"


_HELD: dict = {}


def hold_ctrl_c_in_dispatch(counter) -> None:
    """Run the dispatch handler of an entered FlopCounterMode with Ctrl-C held
    (`interrupts.held`): torch's handler pushes the mode and pops it again around a decomposition
    (``with self:``), and a KeyboardInterrupt between the two would leave it on the dispatch stack
    for good. The mode (torch >= 2.5: the ``_FlopCounterMode`` in ``counter.mode``, before: the
    counter) becomes an instance of a subclass of the same name whose handler is held."""
    from tunekit.measure.interrupts import held

    mode = getattr(counter, "mode", None)
    mode = counter if mode is None else mode
    cls = type(mode)
    if cls in _HELD.values():
        return
    if cls not in _HELD:
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return held(cls.__torch_dispatch__, self, func, types, args, kwargs)

        _HELD[cls] = type(cls.__name__, (cls,), {"__torch_dispatch__": __torch_dispatch__,
                                                 "__qualname__": cls.__qualname__})
    mode.__class__ = _HELD[cls]


def in_autograd_backward() -> bool:
    """True while the autograd engine runs a backward pass on this thread."""
    return torch._C._current_graph_task_id() != -1


def storage_id(t: torch.Tensor) -> int:
    """The identity of the storage behind ``t`` (views and tied tensors share it): the address of
    its StorageImpl, which fake tensors (no data, ``data_ptr()`` 0) have as real ones do."""
    return t.untyped_storage()._cdata


def storage_weakref(storage):
    """A weak reference to an untyped storage (``.expired()`` once it is freed)."""
    from torch.multiprocessing.reductions import StorageWeakRef

    return StorageWeakRef(storage)


def op_argument_names(packet) -> list[str]:
    """Argument names of an aten op overload packet's default overload (its schema), or []."""
    try:
        return [a.name for a in packet.default._schema.arguments]
    except AttributeError:
        return []


def compiled_graphs() -> int | None:
    """Graphs Dynamo has compiled in this process so far; None while Dynamo was never used.
    (Dynamo's own counters: the public API has no such count.)"""
    utils = sys.modules.get("torch._dynamo.utils")
    return None if utils is None else int(utils.counters["stats"]["unique_graphs"])



# --- torch.profiler's memory profiler and the CUDA allocator's history (private in torch 2.x) ----


def memory_timeline(prof, device: str) -> tuple[list, dict]:
    """(times in us, {torch category name or None: bytes alive at each time}) for ``device``
    from a finished ``torch.profiler.profile(profile_memory=True, record_shapes=True,
    with_stack=True)``. torch's own plots use the same private pair: ``prof._memory_profile()``
    and ``MemoryProfileTimeline._coalesce_timeline`` (one column per ``_CATEGORY_TO_INDEX`` entry,
    after a leading unused one)."""
    from torch.profiler._memory_profiler import _CATEGORY_TO_INDEX, MemoryProfileTimeline

    timeline = MemoryProfileTimeline(prof._memory_profile())
    times, sizes = timeline._coalesce_timeline(device)
    names = {i + 1: (c.name if c is not None else None) for c, i in _CATEGORY_TO_INDEX.items()}
    by_category = {name: [row[i] for row in sizes] for i, name in names.items()}
    return list(times), by_category


def cuda_memory_history(enabled: bool, max_entries: int = 100_000) -> None:
    """Start (or stop) recording every CUDA allocation with its stack, for a memory_viz snapshot."""
    torch.cuda.memory._record_memory_history(enabled="all" if enabled else None, max_entries=max_entries)


def cuda_memory_snapshot(path) -> str:
    """Write the recorded CUDA allocator history to ``path`` (a pickle https://pytorch.org/memory_viz reads)."""
    torch.cuda.memory._dump_snapshot(str(path))
    return str(path)


def cpp_min_log_level(level: int | None = None) -> int | None:
    """c10's ``FLAGS_caffe2_log_level``, the threshold of its own C++ logging (0 INFO, 1 WARNING,
    2 ERROR, 3 FATAL), set to ``level`` when given; returns the level before, or None where
    libc10 does not export it.

    Needed because the memory profiler's CPU allocator hook writes "Memory block of unknown size
    was allocated before the profiling started" straight to stderr (C++ LOG(WARNING), no Python
    warning to filter) whenever a tensor made before the trace is freed during it, which every
    training step does; a notebook shows it as an error."""
    import ctypes
    import os
    import sys

    name = {"darwin": "libc10.dylib", "win32": "c10.dll"}.get(sys.platform, "libc10.so")
    try:
        flag = ctypes.c_int.in_dll(ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", name)),
                                   "FLAGS_caffe2_log_level")
    except (OSError, ValueError):
        return None
    before = flag.value
    if level is not None:
        flag.value = level
    return before


def dispatch_mode_class():
    """torch's base class for a mode that sees every op on the dispatcher (c10d collectives
    included). Public in spirit (CommDebugMode builds on it), private by module name."""
    from torch.utils._python_dispatch import TorchDispatchMode

    return TorchDispatchMode


def unbox_process_group(obj):
    """The ProcessGroup behind the script object a c10d op receives as its group argument."""
    return torch._C._distributed_c10d.ProcessGroup.unbox(obj)


def has_fake_params(optimizer) -> bool:
    """True when ``optimizer`` steps fake tensors (a plan's fake step), by its first parameter."""
    from torch._subclasses.fake_tensor import FakeTensor

    return any(isinstance(p, FakeTensor) for g in getattr(optimizer, "param_groups", ())[:1] for p in g["params"][:1])


def fake_scalar_reads():
    """A context in which reading a fake tensor's value (``.item()``: aten._local_scalar_dense)
    gives 1 of its dtype instead of raising: torch's Adafactor reads its step count and two norms
    per parameter as Python numbers, which a fake tensor does not have. Only the values the
    optimizer's arithmetic takes change (its learning-rate factors); what it allocates and the ops
    it runs do not depend on them. Real tensors' reads pass through."""
    from torch._subclasses.fake_tensor import FakeTensor

    mode_cls = dispatch_mode_class()
    scalar = torch.ops.aten._local_scalar_dense.default

    class FakeScalars(mode_cls):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is scalar and isinstance(args[0], FakeTensor):
                dtype = args[0].dtype
                return True if dtype == torch.bool else 1.0 if dtype.is_floating_point else 1
            return func(*args, **(kwargs or {}))

    return FakeScalars()


def fake_scalar_reads_for(optimizer):
    """`fake_scalar_reads` around an ``optimizer.step()`` that steps fake tensors (Adafactor's
    ``.item()`` in a plan's fake step); a real optimizer's step runs as it is."""
    return fake_scalar_reads() if has_fake_params(optimizer) else contextlib.nullcontext()


def autograd_sequence_nr() -> int:
    """The sequence number the next autograd node made on this thread will get (nodes are numbered
    in creation order: measure.live tells a forward's own nodes by it)."""
    return torch._C._autograd._get_sequence_nr()


def node_sequence_nr(node) -> int:
    """The creation number of autograd node ``node`` (a ``grad_fn``)."""
    return node._sequence_nr()


def current_autograd_node():
    """The autograd node backward is running now on this thread, None outside one."""
    return torch._C._current_autograd_node()
