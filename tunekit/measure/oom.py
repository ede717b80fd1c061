"""Out-of-memory: one rule to recognize it, one way to give the memory back. Measurement layer.

Recognized: ``torch.cuda.OutOfMemoryError``, Python's ``MemoryError`` and torch's CPU allocator
(``RuntimeError: ... DefaultCPUAllocator: can't allocate memory``), plus other runtime errors
that say "out of memory".
"""
from __future__ import annotations

import gc
import os
import traceback

from tunekit.measure.device import cuda_device_index, torch_if_loaded
from tunekit.measure.meters import cpu_rss_bytes, malloc_trim

ADVICE = ("Try a smaller micro batch with gradient accumulation, bf16, activation checkpointing "
          "or a lighter optimizer")


def is_oom(exc: BaseException | None) -> bool:
    """True for every kind of out-of-memory error tunekit knows."""
    if exc is None:
        return False
    if isinstance(exc, MemoryError):
        return True
    torch = torch_if_loaded()
    if torch is not None and isinstance(exc, torch.cuda.OutOfMemoryError):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and ("out of memory" in text.lower()
                                              or "can't allocate memory" in text
                                              or "not enough memory" in text)


def free_memory(device=None, collect: bool = True) -> None:
    """Collect garbage and hand cached memory back: CUDA's cache when CUDA is in use (or
    ``device`` is CUDA), and glibc's heap on CPU. ``collect=False`` skips the garbage
    collection (tenths of a second in a big process) when nothing cyclic was left behind."""
    if collect:
        gc.collect()
    kind = getattr(device, "type", None if device is None else str(device).split(":")[0])
    torch = torch_if_loaded()
    if torch is not None and (kind == "cuda" or (kind is None and cuda_device_index() is not None)):
        torch.cuda.empty_cache()
    if kind in (None, "cpu"):
        malloc_trim()


def memory_now_bytes(device) -> int:
    """Bytes in use now: torch-allocated on CUDA, process RSS on CPU."""
    if getattr(device, "type", str(device)) == "cuda":
        return torch_if_loaded().cuda.memory_allocated(device)
    return cpu_rss_bytes()


def drop_frames(exc: BaseException) -> None:
    """Cut ``exc``'s traceback below the frame handling it, so that the frames it came through
    can go: a traceback that is kept (IPython's ``sys.last_traceback``, ``pytest.raises``) would
    keep the failed step's tensors alive. Clearing those frames' variables is not enough: a frame
    keeps its function, and torch's module calls hold their arguments in closures. Where it
    came from stays, as a note."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        tb = exc.__traceback__
        if tb is not None and tb.tb_next is not None:
            inner = traceback.extract_tb(tb.tb_next)[-3:]
            exc.add_note("tunekit: stopped in " + " < ".join(
                f"{f.name} ({os.path.basename(f.filename)}:{f.lineno})" for f in reversed(inner)))
            tb.tb_next = None
        exc = exc.__context__


def explain_and_free(device=None) -> str:
    """Free what a failed block left behind and say so (the record's note)."""
    free_memory(device)
    return f"out of memory: memory was freed (gc + cache release). {ADVICE}"
