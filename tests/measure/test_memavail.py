"""Memory available to this process: /proc/meminfo, cgroup v2 and v1 limits and CUDA's free
memory, read from fake files and a mocked torch.cuda."""
from pathlib import Path

import torch

from tunekit.core.units import MiB
from tunekit.measure import memavail
from tunekit.measure.memavail import Available


def _write(root: Path, files: dict) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_meminfo_available(tmp_path):
    _write(tmp_path, {"meminfo": "MemTotal:       24684084 kB\nMemFree:  1 kB\nMemAvailable:   23002308 kB\n",
                      "old": "MemTotal:       24684084 kB\nMemFree:  1 kB\n"})
    assert memavail.meminfo_available(tmp_path / "meminfo") == 23002308 * 1024  # kB are KiB
    assert memavail.meminfo_available(tmp_path / "old") is None       # kernels before 3.14
    assert memavail.meminfo_available(tmp_path / "absent") is None


def test_cgroup_v2_takes_the_tightest_level_and_counts_reclaimable_cache(tmp_path):
    _write(tmp_path, {
        "self_cgroup": "0::/user.slice/app\n",
        "fs/user.slice/app/memory.max": "1073741824\n", "fs/user.slice/app/memory.current": "536870912\n",
        "fs/user.slice/app/memory.stat": "anon 1\ninactive_file 104857600\nactive_file 9\n",
        "fs/user.slice/memory.max": "max\n", "fs/user.slice/memory.current": "999\n",
    })
    found = memavail.cgroup_available(tmp_path / "self_cgroup", tmp_path / "fs")
    assert found.bytes == 1073741824 - 536870912 + 104857600          # 641728512
    assert "cgroup v2" in found.source and "user.slice/app/memory.max" in found.source
    # an ancestor with less headroom binds: 800 MiB - 700 MiB, no memory.stat
    _write(tmp_path, {"fs/user.slice/memory.max": f"{800 * MiB}", "fs/user.slice/memory.current": f"{700 * MiB}"})
    assert memavail.cgroup_available(tmp_path / "self_cgroup", tmp_path / "fs").bytes == 100 * MiB


def test_cgroup_v1_in_a_container_and_unlimited(tmp_path):
    # the path names the host's cgroup; inside the container only the mount's own level exists
    _write(tmp_path, {
        "self_cgroup": "9:cpu,cpuacct:/docker/abc\n4:memory:/docker/abc\n0::/\n",
        "fs/memory/memory.limit_in_bytes": f"{2048 * MiB}\n", "fs/memory/memory.usage_in_bytes": f"{1536 * MiB}\n",
        "fs/memory/memory.stat": "cache 5\ninactive_file 7\ntotal_inactive_file 1048576\n",
    })
    found = memavail.cgroup_available(tmp_path / "self_cgroup", tmp_path / "fs")
    assert found.bytes == 512 * MiB + 1048576 and "cgroup v1" in found.source   # 2048 - 1536 MiB + 1 MiB
    _write(tmp_path, {"fs/memory/memory.limit_in_bytes": "9223372036854771712\n"})  # v1's "no limit"
    assert memavail.cgroup_available(tmp_path / "self_cgroup", tmp_path / "fs") is None
    assert memavail.cgroup_available(tmp_path / "absent", tmp_path / "fs") is None


def test_cpu_available_is_the_smaller_figure_psutil_elsewhere(tmp_path, monkeypatch):
    _write(tmp_path, {"meminfo": "MemAvailable:   2097152 kB\n", "self_cgroup": "0::/\n",
                      "fs/memory.max": f"{1024 * MiB}", "fs/memory.current": f"{768 * MiB}"})
    args = dict(cgroup_file=tmp_path / "self_cgroup", root=tmp_path / "fs")
    assert memavail.cpu_available(tmp_path / "meminfo", **args).bytes == 256 * MiB   # cgroup < 2 GiB
    _write(tmp_path, {"fs/memory.max": "max"})
    got = memavail.cpu_available(tmp_path / "meminfo", **args)
    assert got.bytes == 2097152 * 1024 and got.source.startswith("MemAvailable")
    import psutil

    monkeypatch.setattr(psutil, "virtual_memory", lambda: type("VM", (), {"available": 12345})())
    got = memavail.cpu_available(tmp_path / "no-proc", **args)    # macOS, Windows: no /proc
    assert got == Available(12345, "psutil.virtual_memory().available")


def test_cuda_available_counts_torch_unused_cache(monkeypatch):
    # mocked: cudaMemGetInfo says 10 GiB free; torch holds 3 GiB reserved, 1 GiB of it in use
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda i: (10 * 2**30, 80 * 2**30))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda i: 3 * 2**30)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda i: 2**30)
    got = memavail.available(torch.device("cuda", 1))
    assert got.bytes == 12 * 2**30 and got.source.startswith("cuda:1 free")   # 10 + 3 - 1 GiB
    assert memavail.available(torch.device("meta")) is None


def test_this_machine():
    import psutil

    got = memavail.available("cpu")
    assert 0 < got.bytes <= psutil.virtual_memory().total and got.source
