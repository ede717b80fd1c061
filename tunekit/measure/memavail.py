"""How much memory this process can still take: CPU RAM and a CUDA device. Measurement layer;
reads a few files (or asks the driver), allocates nothing.

    >>> available("cpu")        # Available(bytes=23554064384, source='MemAvailable in /proc/meminfo')
    >>> available("cuda:0")     # free device memory plus what torch's cache holds unused

CPU: the kernel's ``MemAvailable`` (free memory plus what it can reclaim without swapping),
capped by this process' cgroup, whose limit kills the process even while the machine has RAM
to spare: v2 ``memory.max - memory.current``, v1 ``memory.limit_in_bytes - memory.usage_in_bytes``,
over the process' cgroup and every ancestor. psutil where ``/proc`` is missing (macOS, Windows).
The readers take their paths as arguments, so tests hand them fake files.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tunekit.measure.device import torch_if_loaded

# v1 writes "no limit" as the largest page-aligned long (9223372036854771712)
_NO_LIMIT_V1 = 2**62


@dataclass(frozen=True)
class Available:
    bytes: int
    source: str     # where the figure comes from, in words (shown in every refusal)


def meminfo_available(path="/proc/meminfo") -> int | None:
    """``MemAvailable`` in bytes, or None (no such file; kernels before 3.14 lack the line)."""
    try:
        text = Path(path).read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024   # the file says kB and means KiB
    return None


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return None if text == "max" else int(text)   # v2 writes "max" for no limit


def _stat(path: Path, key: str) -> int:
    try:
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except OSError:
        pass
    return 0


# (where the hierarchy is mounted under root, limit file, usage file, reclaimable page cache in
# memory.stat): the kernel drops that cache before it kills, so it counts as available
_HIERARCHIES = {
    "v2": (("", "unified"), "memory.max", "memory.current", "inactive_file"),
    "v1": (("memory",), "memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file"),
}


def cgroup_available(cgroup_file="/proc/self/cgroup", root="/sys/fs/cgroup") -> Available | None:
    """The tightest cgroup headroom (limit - usage + inactive page cache) over this process'
    cgroup and its ancestors, v2 and v1 alike; None when no level has a memory limit."""
    try:
        lines = Path(cgroup_file).read_text().splitlines()
    except OSError:
        return None
    best = None
    for line in lines:
        parts = line.split(":", 2)   # hierarchy-id:controllers:path
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        kind = "v2" if controllers == "" else "v1" if "memory" in controllers.split(",") else None
        if kind is None:
            continue
        mounts, limit_name, usage_name, cache_key = _HIERARCHIES[kind]
        for mount in mounts:
            base = Path(root) / mount
            # in a container the path is often the host's; walking up reaches the mount itself
            here = base / path.strip("/")
            for level in [here, *here.parents]:
                if level != base and base not in level.parents:
                    break
                limit = _read_int(level / limit_name)
                usage = _read_int(level / usage_name)
                if limit is None or usage is None or limit >= _NO_LIMIT_V1:
                    continue
                free = max(0, limit - usage + _stat(level / "memory.stat", cache_key))
                if best is None or free < best.bytes:
                    best = Available(free, f"cgroup {kind} limit {level / limit_name} "
                                           f"({limit} B) minus its usage")
    return best


def cpu_available(meminfo="/proc/meminfo", cgroup_file="/proc/self/cgroup",
                  root="/sys/fs/cgroup") -> Available:
    """RAM this process can still take: the smaller of MemAvailable and the cgroup headroom."""
    free = meminfo_available(meminfo)
    if free is None:
        import psutil

        found = Available(int(psutil.virtual_memory().available), "psutil.virtual_memory().available")
    else:
        found = Available(free, f"MemAvailable in {meminfo}")
    limited = cgroup_available(cgroup_file, root)
    return limited if limited is not None and limited.bytes < found.bytes else found


def cuda_available(index: int) -> Available:
    """Free memory of CUDA device ``index`` (cudaMemGetInfo) plus what torch's caching allocator
    holds without using it (reserved - allocated), which torch hands out before asking CUDA."""
    torch = torch_if_loaded()
    free, _total = torch.cuda.mem_get_info(index)
    cached = torch.cuda.memory_reserved(index) - torch.cuda.memory_allocated(index)
    return Available(int(free + cached), f"cuda:{index} free (torch.cuda.mem_get_info) + torch's unused cache")


def available(device, cuda_index: int | None = None) -> Available | None:
    """Memory a block on ``device`` can still take; None where tunekit cannot tell (MPS, ...)."""
    kind = getattr(device, "type", str(device).split(":")[0])
    if kind == "cpu":
        return cpu_available()
    if kind == "cuda":
        index = cuda_index if cuda_index is not None else getattr(device, "index", None)
        return cuda_available(index if index is not None else torch_if_loaded().cuda.current_device())
    return None
