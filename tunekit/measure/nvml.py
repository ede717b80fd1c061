"""NVML readings (nvidia-ml-py's `pynvml`): what the GPU driver sees, not only torch's allocator.

NVML numbers devices physically; torch numbers the ones CUDA_VISIBLE_DEVICES lets it see. So
torch's cuda:1 under CUDA_VISIBLE_DEVICES=2,3 is NVML index 3. We match by the device UUID when
torch reports it, and fall back to that index mapping. Everything degrades to None plus
a reason when NVML or a driver is missing.
"""
from __future__ import annotations

import os

_state = {"init": None, "error": None}


def visible_to_nvml(torch_index: int, visible: str | None = None) -> int | str:
    """Map a torch CUDA index to an NVML index (int) or a UUID (str, for `GPU-…`/`MIG-…` entries).

    >>> visible_to_nvml(1, "2,3")
    3
    """
    visible = os.environ.get("CUDA_VISIBLE_DEVICES") if visible is None else visible
    if visible is None or visible.strip() == "":
        return torch_index
    entries = [e.strip() for e in visible.split(",") if e.strip()]
    if torch_index >= len(entries):
        raise IndexError(f"cuda:{torch_index} is not among CUDA_VISIBLE_DEVICES={visible!r}")
    entry = entries[torch_index]
    return int(entry) if entry.isdigit() else entry


def library():
    """The initialized ``pynvml`` module, or None where NVML is unavailable
    (`unavailable_reason` says why). Initialized once per process."""
    if _state["init"] is None:
        try:
            import pynvml

            pynvml.nvmlInit()
            _state["init"] = pynvml
        except Exception as e:  # ImportError, NVMLError_LibraryNotFound, driver missing
            _state["init"] = False
            _state["error"] = f"NVML unavailable ({type(e).__name__}: {e})".strip()
    return _state["init"] or None


def _torch_uuid(torch_index: int) -> str | None:
    # The surest link between the two numberings: the device's UUID. CUDA orders devices
    # fastest-first unless CUDA_DEVICE_ORDER=PCI_BUS_ID, NVML always by PCI bus.
    import sys

    torch = sys.modules.get("torch")
    try:
        uuid = str(torch.cuda.get_device_properties(torch_index).uuid)
    except Exception:  # torch absent, too old for .uuid, or no such device
        return None
    return uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"


def handle(torch_index: int):
    """The NVML device handle behind a torch CUDA index, or None if NVML is unavailable."""
    nv = library()
    if nv is None:
        return None
    uuid = _torch_uuid(torch_index)
    if uuid is not None:
        try:
            return nv.nvmlDeviceGetHandleByUUID(uuid)
        except Exception:
            pass  # e.g. a MIG slice: fall back to CUDA_VISIBLE_DEVICES
    target = visible_to_nvml(torch_index)
    if isinstance(target, int):
        return nv.nvmlDeviceGetHandleByIndex(target)
    return nv.nvmlDeviceGetHandleByUUID(target)


def used_bytes(torch_index: int | None) -> tuple[float | None, str | None]:
    """(device memory used as NVML sees it, None) or (None, why not)."""
    if torch_index is None:
        return None, "no CUDA device in use"
    try:
        h = handle(torch_index)
    except Exception as e:
        return None, f"NVML lookup failed ({e})"
    if h is None:
        return None, _state["error"]
    return float(library().nvmlDeviceGetMemoryInfo(h).used), None


def unavailable_reason() -> str | None:
    """Why NVML cannot be used here, or None if it can."""
    library()
    return _state["error"]
