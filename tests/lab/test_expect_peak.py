"""lab.expect's peak on a CPU (issue 42): the process's floor now, plus the plan's peak, plus the
base run's unplanned bytes scaled by the tokens of a micro-batch; exact arithmetic on made-up plans
and runs, and the floor read off a real process."""
import math
from types import SimpleNamespace

import torch

from tunekit.core.notes import of_kind
from tunekit.core.setting import Setting
from tunekit.lab import expect as ex
from tunekit.measure import device_meter

MiB = 2**20


def plan(total, weights=2, states=4, buffers=0, micro_batch=8, seq_len=128):
    comps = {"weights": weights * MiB, "master_weights": 0.0, "gradients": weights * MiB,
             "optimizer_states": states * MiB, "activations": 20 * MiB, "buffers": buffers * MiB}
    return SimpleNamespace(total_bytes=total * MiB, components=comps,
                           setting=Setting(micro_batch=micro_batch, seq_len=seq_len))


def run(peak=400, start=350):
    return SimpleNamespace(run_id=1, peak_mem_bytes=peak * MiB,
                           peak_mem_start_bytes=None if start is None else start * MiB)


CPU = SimpleNamespace(device=SimpleNamespace(type="cpu"))


def test_the_base_setting_is_expected_as_its_run_measured():
    # floor 344 = start 350 - kept 6 (weights 2 + states 4); 344 + 30 + (50 - 24) = 400
    base = plan(30)
    peak, base_peak, notes = ex.peak_of(CPU, base, run(), base, floor=344 * MiB)
    assert (peak, base_peak, notes) == (400 * MiB, 400 * MiB, [])


def test_the_unplanned_bytes_follow_the_tokens():
    # the base's steps added 400 - 350 = 50 MiB above the start against a planned transient of
    # 30 - 6 = 24: 26 MiB unplanned at 8 x 128 tokens
    base = plan(30)
    # twice the micro-batch: 344 + 54 + 26 * 2 = 450
    assert ex.peak_of(CPU, plan(54, micro_batch=16), run(), base, floor=344 * MiB)[0] == 450 * MiB
    # twice the sequence too: 4x the tokens: 344 + 100 + 26 * 4 = 548
    assert ex.peak_of(CPU, plan(100, micro_batch=16, seq_len=256), run(), base, floor=344 * MiB)[0] == 548 * MiB
    # checkpointing (same tokens, a smaller plan): 344 + 19 + 26 = 389
    assert ex.peak_of(CPU, plan(19), run(), base, floor=344 * MiB)[0] == 389 * MiB


def test_before_any_run_a_cpu_peak_is_the_process_plus_the_plan_as_lab_run_reads_it():
    # lab.run's CPU peak is the process's RSS (~400 MiB for cpu-tiny), so the plan's 30 MiB of
    # tensors alone would read as a step of a tenth of what the run then says: the floor 344 is
    # added to both sides. 344 + 54 = 398 expected against 344 + 30 = 374 for the base
    peak, base_peak, notes = ex.peak_of(CPU, plan(54, micro_batch=16), None, plan(30), floor=344 * MiB)
    assert (peak, base_peak, notes) == (398 * MiB, 374 * MiB, [])
    # a GPU's allocator peak is the plan's own
    gpu = SimpleNamespace(device=SimpleNamespace(type="cuda"))
    assert ex.peak_of(gpu, plan(54), None, plan(30))[:2] == (54 * MiB, 30 * MiB)


def test_a_model_counting_samples_scales_the_unplanned_bytes_by_its_samples_alone():
    # a batch_fn of your own that leaves seq_len out (its runs count samples): seq_len 1 -> 256 is
    # the same step, not 256x the unplanned 26 MiB (+13% peak for a step the plan saw unchanged)
    base, same = plan(30, seq_len=1), plan(30, seq_len=256)
    base.unit = same.unit = "samples"
    assert ex.peak_of(CPU, same, run(), base, floor=344 * MiB)[0] == 400 * MiB    # 344 + 30 + 26
    twice = plan(54, micro_batch=16, seq_len=256)
    twice.unit = "samples"
    assert ex.peak_of(CPU, twice, run(), base, floor=344 * MiB)[0] == 450 * MiB   # 344 + 54 + 26 * 2


def test_the_floor_is_the_process_now():
    # the process grew by 18 MiB since the base run (a profiler loaded): 362 + 30 + 26 = 418
    base = plan(30)
    assert ex.peak_of(CPU, base, run(), base, floor=362 * MiB)[0] == 418 * MiB


def test_a_run_without_a_start_reading_carries_one_offset_and_says_so():
    # a run read back from an older log: 400 measured - 30 planned = 370 carried; 54 + 370 = 424
    peak, _, notes = ex.peak_of(CPU, plan(54, micro_batch=16), run(start=None), plan(30), floor=0)
    assert peak == 424 * MiB and len(of_kind(notes, "expect.peak_offset")) == 1


def test_a_gpu_peak_is_still_a_ratio():
    gpu = SimpleNamespace(device=SimpleNamespace(type="cuda"))
    assert ex.peak_of(gpu, plan(60), run(peak=45), plan(30))[0] == 90 * MiB


def test_held_bytes_are_what_a_step_keeps():
    # weights 2 + master 0 + states 4 + buffers 1 (not the gradients, not the activations)
    assert ex.held_bytes(plan(30, buffers=1)) == 7 * MiB
    assert math.isnan(ex.held_bytes(SimpleNamespace(total_bytes=1.0)))


def test_the_lab_floor_leaves_out_the_tensors_the_lab_holds(monkeypatch):
    model = torch.nn.Linear(256, 256)       # 256 * 256 + 256 = 65,792 floats = 263,168 bytes
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.ones(1, 256)).sum().backward()
    opt.step()                              # momentum buffers: another 263,168 bytes; grads: 263,168
    monkeypatch.setattr(device_meter, "settled_rss_bytes", lambda: 400 * MiB)
    floor = ex.lab_floor_bytes(SimpleNamespace(model=model, optimizer=opt))
    assert floor == 400 * MiB - 3 * 263_168
