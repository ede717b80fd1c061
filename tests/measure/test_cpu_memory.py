"""CPU memory figures (RSS delta, exact peak) and what RSS cannot see.

RSS counts resident pages, not allocations: a block whose tensor reuses freed memory the process
still holds (a hole in glibc's heap) moves RSS by nothing, and a tensor freed into such a hole
leaves RSS where it was. Which one happens depends on everything the process did before, so these
checks run in a fresh process, one script, where the heap is built on purpose: without a hole
(RSS must see everything) and with one (the record must say what RSS missed).
"""
import json
import subprocess
import sys

import pytest

MiB = 2**20

SCRIPT = r"""
import json, torch, tunekit
from tunekit.core.notes import of_kind
MiB = 2**20
out = {}

def rec_of(r):
    return {"rss": r.cpu_rss_delta_bytes, "peak": r.cpu_peak_delta_bytes,
            "unseen": [str(n) for n in of_kind(r.notes, "memory.rss_unseen")]}

# a fresh heap: 128 MiB is above glibc's mmap threshold (32 MiB at most), so it gets pages of its own
with tunekit.profile(name="temp", flops="never") as r:
    t = torch.ones(128 * MiB // 4)
    del t
out["temp"] = rec_of(r)
big = torch.ones(128 * MiB // 4)
with tunekit.profile(name="free", flops="never") as r:
    del big
out["free"] = rec_of(r)
with tunekit.profile(name="outer", flops="never") as outer:
    t = torch.ones(128 * MiB // 4)
    del t                                  # freed before the inner block resets the high-water mark
    with tunekit.profile(name="inner", flops="never"):
        pass
out["outer"] = rec_of(outer)

# a hole: a freed 30 MiB chunk raises the mmap threshold to 30 MiB, so ten 20 MiB buffers go to the
# heap, side by side (bytearray: no small objects between them); a 1 MiB one above keeps the heap's
# top from shrinking; freed, they leave a 200 MiB hole whose pages stay resident
torch.empty(30 * MiB // 4).fill_(1)
held = [bytearray(20 * MiB) for _ in range(10)]
lid = bytearray(MiB)
del held
with tunekit.profile(name="reuse", flops="never") as r:
    t = torch.ones(100 * MiB // 4)
out["reuse"] = rec_of(r)
with tunekit.profile(name="refree", flops="never") as r:
    del t
out["refree"] = rec_of(r)
# a monitored loop whose steps keep 60 MiB between them, served from the hole again (its set-up
# may have taken a few small chunks in the middle of the hole: less than half of it is asked for)
model, kept = torch.nn.Linear(4, 4), []
mon = tunekit.Monitor(model, live=False, warmup=0, flops="never")
for i in range(3):
    with mon.step():
        model(torch.ones(2, 4)).sum().backward()
        if i == 1:
            kept.append(torch.ones(60 * MiB // 4))
out["monitor"] = rec_of(mon.close())
del kept
ns = {}
with tunekit.experiment("exp", namespace=ns, quiet=True) as exp:
    ns["tmp"] = torch.ones(100 * MiB // 4)  # the hole again
out["exp"] = {"consumed": exp.record.exp_cpu_consumed_bytes, "reclaimed": exp.record.exp_cpu_reclaimed_bytes,
              "unseen": [str(n) for n in of_kind(exp.record.notes, "memory.rss_unseen")], "ns": sorted(ns)}
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def fresh():
    run = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_the_peak_sees_a_temporary_that_is_gone_by_the_end(fresh):
    temp = fresh["temp"]
    assert temp["peak"] >= 128 * MiB * 0.95 and temp["rss"] < 16 * MiB and temp["unseen"] == []


def test_a_block_that_only_frees_memory_has_a_zero_peak_not_a_negative_one(fresh):
    free = fresh["free"]
    assert free["rss"] < -120 * MiB and 0 <= free["peak"] < 4 * MiB and free["unseen"] == []


def test_a_nested_block_keeps_the_outer_peak(fresh):
    assert fresh["outer"]["peak"] >= 128 * MiB * 0.95


def test_memory_reused_from_a_hole_is_said_not_hidden(fresh):
    reuse, refree = fresh["reuse"], fresh["refree"]
    # RSS moves by a few pages at most (the tensor's bookkeeping), the 100 MiB nowhere
    assert abs(reuse["rss"]) < 4 * MiB and len(reuse["unseen"]) == 1
    assert "allocations grew by 100.0 MiB" in reuse["unseen"][0]
    assert abs(refree["rss"]) < 4 * MiB and len(refree["unseen"]) == 1
    assert "freed 100.0 MiB" in refree["unseen"][0]


def test_a_monitored_run_says_what_its_rss_missed(fresh):
    mon = fresh["monitor"]
    # RSS moves by what the monitor's first steps import and set up (~5 MiB), the 60 MiB nowhere
    assert abs(mon["rss"]) < 16 * MiB and len(mon["unseen"]) == 1
    assert "allocations grew by 60.0 MiB" in mon["unseen"][0]


def test_the_leak_check_sees_through_the_hole(fresh):
    # the experiment hands freed heap pages back before each RSS reading: 100 MiB consumed, then
    # reclaimed once its variable is deleted, though the tensor sat in the hole
    exp = fresh["exp"]
    assert exp["consumed"] > 96 * MiB and exp["reclaimed"] > 96 * MiB and exp["ns"] == []
