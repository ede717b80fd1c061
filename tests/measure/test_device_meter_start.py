"""The CPU peak of a run starts from a settled heap (issue 42): DeviceMeter hands glibc's freed
pages back (malloc_trim) before it reads its start, so a block that allocates into memory an
earlier block freed is measured by what it touches, the same whatever ran before it.

The heap is built on purpose in a fresh process, as in test_cpu_memory.py: a freed 30 MiB chunk
raises glibc's mmap threshold to 30 MiB, so ten 20 MiB buffers go to the heap side by side; a
1 MiB one above keeps the top from shrinking; freed, they leave a 200 MiB hole still resident.
"""
import json
import subprocess
import sys

import pytest

from tunekit.core.notes import kind_of
from tunekit.measure import device_meter

MiB = 2**20

SCRIPT = r"""
import json, torch
from tunekit.measure.device_meter import DeviceMeter
from tunekit.measure.meters import cpu_rss_bytes
MiB = 2**20
out = {}

def block():
    t = torch.ones(100 * MiB // 4)   # 100 MiB, every page written
    del t

def measured(settle):
    m = DeviceMeter("cpu", settle=settle).start()
    block()
    peak = m.stop()
    return {"above": peak - m.start_bytes, "start": m.start_bytes, "notes": [str(n) for n in m.notes]}

torch.empty(30 * MiB // 4).fill_(1)
held = [bytearray(20 * MiB) for _ in range(10)]
lid = bytearray(MiB)
del held
out["rss_with_hole"] = cpu_rss_bytes()
out["bare"] = measured(settle=False)      # the hole serves the block: RSS does not move
out["settled"] = measured(settle=True)
block()                                   # the block's pages freed again into the heap
out["again"] = measured(settle=True)
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def fresh():
    run = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_a_bare_rss_peak_misses_a_block_served_from_freed_heap(fresh):
    # what the settled meter fixes: 100 MiB allocated, written and freed, and RSS saw almost none of it
    assert fresh["bare"]["above"] < 4 * MiB


def test_the_settled_start_hands_the_hole_back(fresh):
    # 200 MiB of freed buffers were resident; the settled start reads RSS without (most of) them
    assert fresh["rss_with_hole"] - fresh["settled"]["start"] > 190 * MiB


def test_the_settled_peak_is_what_the_block_touched(fresh):
    # 100 MiB = 25,600 pages of 4 KiB, all written; the kernel batches RSS counters per thread
    # (a few hundred KiB), the tensor's own bookkeeping is bytes
    for name in ("settled", "again"):
        assert 99 * MiB <= fresh[name]["above"] <= 102 * MiB, (name, fresh[name]["above"] / MiB)
        assert fresh[name]["notes"] == []


def test_the_same_block_reads_the_same_peak_after_another(fresh):
    # measured twice, the second after the block ran unmeasured and freed into the heap: within 1 MiB
    assert abs(fresh["settled"]["above"] - fresh["again"]["above"]) <= MiB


def test_without_malloc_trim_the_peak_says_it_cannot_be_trusted(monkeypatch):
    monkeypatch.setattr(device_meter, "malloc_trim", lambda: None)   # a libc without it (musl, macOS)
    m = device_meter.DeviceMeter("cpu").start()
    m.stop()
    assert [kind_of(n) for n in m.notes] == ["memory.untrimmed"]


def test_the_record_names_the_settled_meter():
    assert "malloc_trim" in device_meter.DeviceMeter("cpu").source
    assert "malloc_trim" not in device_meter.DeviceMeter("cpu", settle=False).source
    assert device_meter.DeviceMeter("meta").source == "not measured on meta"
