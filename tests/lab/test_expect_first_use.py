"""lab.expect's CPU peak adds the memory a kernel library keeps once per process (issue 42: a first
bf16 run raised the small Llama's floor by 15.5 MiB): exact arithmetic on made-up kernels and
figures, the toggles a Lab's steps ran resolved to their plans' kernels, and the note."""
from types import SimpleNamespace

import pytest

from tunekit.core.notes import of_kind
from tunekit.lab import expect_peak as ep

MiB = 2**20
FIGURES = {"fp32": {"dtype_bytes": 0.5 * MiB, "shape_bytes": 0.25 * MiB, "attention_bytes": 0.25 * MiB},
           "bf16": {"dtype_bytes": 3 * MiB, "shape_bytes": 0.5 * MiB, "attention_bytes": 2 * MiB}}


def mm(dtype="float32", dims=(512, 128, 384, 1), phase="forward", op="mm"):
    return ("matmul", dtype, op, phase, dims)


def sdpa(dtype="float32", phase="forward"):
    return ("attention", dtype, "_scaled_dot_product_flash_attention_for_cpu", phase, (64, 64, 32, 16))


FP32_STEP = {mm(), mm(phase="backward"), mm(dims=(128, 512, 384, 1), phase="backward"), sdpa(), sdpa(phase="backward")}
BF16_STEP = {mm("bfloat16"), mm("bfloat16", phase="backward"), mm("bfloat16", (128, 512, 384, 1), "backward"),
             sdpa("bfloat16"), sdpa("bfloat16", "backward")}


def test_a_step_that_ran_adds_nothing():
    assert ep.first_use_bytes(FP32_STEP, FP32_STEP, FIGURES) == (0.0, [])


def test_a_new_dtype_adds_its_first_matmul_and_attention_and_each_shape():
    extra, new = ep.first_use_bytes(BF16_STEP, FP32_STEP, FIGURES)
    # bf16 matmuls first: 3 MiB; bf16 attention first: 2 MiB; 3 new bf16 matmul shapes x 0.5 MiB = 1.5
    assert extra == 6.5 * MiB and len(new) == 5


def test_new_shapes_of_a_dtype_that_ran_add_their_shape_bytes_alone():
    bigger = FP32_STEP | {mm(dims=(1024, 128, 384, 1)), mm(dims=(1024, 128, 384, 1), phase="backward")}
    # two new fp32 matmul kernels x 0.25 MiB; the dtype and its attention ran already
    assert ep.first_use_bytes(bigger, FP32_STEP, FIGURES)[0] == 0.5 * MiB


def test_a_dtype_without_figures_adds_nothing_and_nothing_ran_adds_every_first_use():
    assert ep.first_use_bytes({mm("float16")}, FP32_STEP, FIGURES)[0] == 0.0
    # nothing ran: fp32 matmul 0.5 + attention 0.25 + three shapes x 0.25 = 1.5 MiB
    assert ep.first_use_bytes(FP32_STEP, set(), FIGURES)[0] == 1.5 * MiB


class Device(str):   # a torch.device's str and type
    @property
    def type(self):
        return str(self)


class FakeLab:   # weakref-able, as a Lab is; its plans by its toggles
    def __init__(self, plans, device="cpu"):
        self.device = Device(device)
        self.plans = plans


@pytest.fixture
def stepped_labs(monkeypatch):
    """An empty registry of what ran; a Lab's toggles planned by its own ``plans`` (toggles -> kernels)."""
    from tunekit.lab import plan as lab_plans
    from tunekit.planning import target

    monkeypatch.setattr(ep, "_RAN", set())
    monkeypatch.setattr(ep, "_STEPPING", type(ep._STEPPING)())
    monkeypatch.setattr(target, "lab_setting", lambda lab, **t: {"precision": t["precision"]})
    monkeypatch.setattr(lab_plans, "cached_plan", lambda lab, device, s: SimpleNamespace(
        expected=SimpleNamespace(kernels=lab.plans[s.precision])))


class Key(str):   # toggles: hashable, with asdict()
    def asdict(self):
        return {"precision": str(self)}


def test_the_toggles_a_lab_stepped_resolve_to_their_plans_kernels_once(stepped_labs):
    lab = FakeLab({"fp32": FP32_STEP, "bf16": BF16_STEP})
    for _ in range(3):
        ep.stepped(lab, Key("fp32"))
    assert lab._stepped == {"fp32": False}                # one entry per toggles, not per step
    assert ep.ran_kernels() == FP32_STEP and lab._stepped == {"fp32": True}
    ep.stepped(lab, Key("bf16"))
    assert ep.ran_kernels() == FP32_STEP | BF16_STEP


def test_a_gpu_labs_steps_add_no_kernels(stepped_labs):
    lab = FakeLab({"fp32": FP32_STEP}, device="cuda")
    ep.stepped(lab, Key("fp32"))
    assert ep.ran_kernels() == set()


def test_peak_of_adds_the_first_use_bytes_with_a_note(stepped_labs, monkeypatch):
    from tunekit.measure import first_use

    monkeypatch.setattr(first_use, "measure_first_use", lambda: {"figures": FIGURES, "verdict": "quiet"})
    lab = FakeLab({"fp32": FP32_STEP})
    ep.stepped(lab, Key("fp32"))
    comps = {"weights": 2 * MiB, "master_weights": 0.0, "optimizer_states": 4 * MiB, "buffers": 0.0}
    base = SimpleNamespace(total_bytes=30 * MiB, components=comps, setting=None,
                           expected=SimpleNamespace(kernels=frozenset(FP32_STEP)))
    bf16 = SimpleNamespace(total_bytes=30 * MiB, components=comps, setting=None,
                           expected=SimpleNamespace(kernels=frozenset(BF16_STEP)))
    run = SimpleNamespace(run_id=1, peak_mem_bytes=400 * MiB, peak_mem_start_bytes=350 * MiB)
    # the base: floor 344 + 30 + unplanned (50 - 24) = 400, its kernels ran: nothing added
    assert ep.peak_of(lab, base, run, base, floor=344 * MiB)[0] == 400 * MiB
    peak, _, notes = ep.peak_of(lab, bf16, run, base, floor=344 * MiB)
    assert peak == 406.5 * MiB                             # 400 + 6.5 (the bf16 firsts and 3 shapes)
    [note] = of_kind(notes, "expect.first_use")
    assert note.startswith("5 matmul and attention kernels tunekit's steps in this process have not run "
                           "(bf16 attention, bf16 matmul): +6.5 MiB")


def test_the_figures_are_measured_on_lab_expects_progress_line_and_only_when_needed(monkeypatch):
    from tunekit.measure import first_use

    # measuring them takes seconds (fresh child processes): a stage of lab.expect's progress line, not a silent
    # wait; a plan whose kernels all ran, or a GPU's, measures nothing
    measured, stages = [], []
    monkeypatch.setattr(first_use, "measure_first_use", lambda: measured.append(1))
    monkeypatch.setattr(ep, "ran_kernels", lambda: FP32_STEP)
    shown = SimpleNamespace(at=lambda stage, fraction=None: stages.append(stage))
    cpu, gpu = (SimpleNamespace(device=SimpleNamespace(type=t)) for t in ("cpu", "cuda"))
    ep.prepare_first_use(cpu, SimpleNamespace(expected=SimpleNamespace(kernels=BF16_STEP)), shown)
    assert measured == [1] and stages == [
        "this CPU's first-use memory of its kernels (measured once in child processes, then cached)"]
    ep.prepare_first_use(cpu, SimpleNamespace(expected=SimpleNamespace(kernels=FP32_STEP)), shown)
    ep.prepare_first_use(gpu, SimpleNamespace(expected=SimpleNamespace(kernels=BF16_STEP)), shown)
    assert measured == [1] and len(stages) == 1
