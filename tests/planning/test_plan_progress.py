"""tunekit.plan's long waits (issue 39): over 2 s it says what it is doing on one line that updates
(stderr in a terminal, the last line only elsewhere), silent when asked; Ctrl-C inside any phase
reaches the caller with nothing left half-made; a GPU plan runs none of the CPU's calibrations;
the advice's single-GPU options are faked without the components pass they never read. Clocks
are fake: no timing is compared."""
import re

import pytest
import torch
import torch.nn.functional as F

import tunekit
from tests.helpers import Tty  # stderr: what is written, a terminal or not
from tunekit.planning import step as plan_step
from tunekit.view import progress


class _Ticking:
    """A clock that moves ``step`` seconds each time it is read."""

    def __init__(self, step):
        self.now, self.step = 0.0, step

    def __call__(self):
        self.now += self.step
        return self.now


def _shown(monkeypatch, tty, step_s, **kw):
    """What stderr got over a cpu-tiny plan on a T4 whose clock moves ``step_s`` per reading (the
    heartbeat thread held off: only the plan's own news draws)."""
    monkeypatch.setattr(progress, "clock", _Ticking(step_s))
    monkeypatch.setattr(progress, "HEARTBEAT_S", 1e9)
    err = Tty(tty)
    monkeypatch.setattr(progress.sys, "stderr", err)
    p = tunekit.plan(tunekit.GPTConfig.preset("cpu-tiny"), "T4", micro_batch=2, seq_len=32, **kw)
    return p, err.text


def test_a_long_plan_says_its_phase_on_one_terminal_line_then_how_long_it_took(monkeypatch):
    p, text = _shown(monkeypatch, tty=True, step_s=1.0)
    assert p.fits
    # the clock is read first at the start, and each reading moves it 1 s: past 2 s every draw shows
    assert "\rtunekit.plan: the plan's fake step: live bytes, backward · " in text
    assert "\rtunekit.plan: the plan's fake step: FLOPs op by op, forward · " in text
    assert "\rtunekit.plan: the plan's fake step: components (saved activations, gradients, optimizer state)" in text
    assert "\rtunekit.plan: the expected step · " in text
    assert re.search(r"\rtunekit\.plan: done in \d+\.\d s\x1b\[K\n$", text) and text.count("\n") == 1


def test_a_short_plan_shows_nothing_and_off_a_terminal_only_its_last_line(monkeypatch):
    # a clock that barely moves: the plan ends before 2 s, nothing is written
    assert _shown(monkeypatch, tty=True, step_s=1e-6)[1] == ""
    # a long plan whose stderr is a log: no redraws, the line at the end
    text = _shown(monkeypatch, tty=False, step_s=1.0)[1]
    assert re.fullmatch(r"tunekit\.plan: done in \d+\.\d s\n", text)


def test_verbose_false_is_silent(monkeypatch):
    assert _shown(monkeypatch, tty=True, step_s=1.0, verbose=False)[1] == ""
    with pytest.raises(ValueError, match="verbose must be True or False"):
        tunekit.plan(tunekit.GPTConfig.preset("cpu-tiny"), "T4", verbose="yes")


def test_the_advice_says_which_combination_of_how_many(monkeypatch):
    # cpu-tiny at 48,000 x 128 under bf16 does not fit an H100: the advice tries combinations
    monkeypatch.setattr(progress, "clock", _Ticking(1.0))
    monkeypatch.setattr(progress, "HEARTBEAT_S", 1e9)
    err = Tty(True)
    monkeypatch.setattr(progress.sys, "stderr", err)
    p = tunekit.plan(tunekit.GPTConfig.preset("cpu-tiny"), "H100 SXM", precision="bf16", micro_batch=48000,
                     seq_len=128)
    assert not p.fits and p.advice
    # checkpointing (2 levels) x bf16 weights (2) x AdamW, 8-bit AdamW, SGD (3) x the micro-batch halved 0..7
    # times (8) = 96, less the plan's own: 95, more than the search's bound of 24 fake steps: "at most 24".
    # The first tried halves the micro-batch, with a bar of 1/24 of 20 = 0.83 -> 1; the second, 8-bit AdamW,
    # 2/24 of 20 = 1.67 -> 2
    head = "\rtunekit.plan: advice: combination 1 of at most 24 (micro_batch=24000, grad_accum=2)"
    assert head + ": live bytes, backward · " in err.text and "[#...................]" in err.text
    assert "\rtunekit.plan: advice: combination 2 of at most 24 (optimizer='adamw_8bit'): live bytes, forward · " \
        in err.text
    assert "[##..................]" in err.text
    assert "advice: the FLOPs of micro_batch=24000, grad_accum=2, which fits: FLOPs op by op" in err.text


def _state():
    """What a plan must leave as it found it: torch's global state it touches while it plans."""
    from torch.nn.modules import module as mod
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    return dict(dropout=F.dropout, sdpa=F.scaled_dot_product_attention, dtype=torch.get_default_dtype(),
                modes=len(_get_current_dispatch_mode_stack()), function_modes=torch._C._len_torch_function_stack(),
                fwd=len(mod._global_forward_hooks), pre=len(mod._global_forward_pre_hooks),
                grad=torch.is_grad_enabled())


@pytest.mark.parametrize("phase", ["components", "live bytes", "FLOPs op by op"])
def test_ctrl_c_in_any_phase_reaches_the_caller_and_leaves_nothing_half_made(monkeypatch, tmp_path, phase):
    from tunekit.measure import memory

    monkeypatch.setenv("TUNEKIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(progress, "clock", _Ticking(1.0))
    monkeypatch.setattr(progress, "HEARTBEAT_S", 1e9)
    err = Tty(True)
    monkeypatch.setattr(progress.sys, "stderr", err)
    # Ctrl-C as the phase's forward ends: its observers (the tally, LiveBytes, the FLOP counter) and
    # the plan's CUDA-like kernels are installed, the checkpointed blocks' activations saved
    where, original = (memory, memory.step_loss) if phase == "components" else (plan_step, plan_step._loss)
    losses = []

    def interrupted(*args):
        loss = original(*args)
        losses.append(loss)
        if phase != "FLOPs op by op" or len(losses) == 2:   # the counting pass is the second _loss
            raise KeyboardInterrupt
        return loss

    monkeypatch.setattr(where, "step_loss" if phase == "components" else "_loss", interrupted)
    before = _state()
    model = tunekit.GPT(tunekit.GPTConfig.preset("cpu-tiny"))   # a real module of the user's: read, never changed
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(KeyboardInterrupt):
        tunekit.plan(model, "T4", micro_batch=2, seq_len=32, checkpointing=True)
    assert losses and _state() == before
    assert all(torch.equal(v, weights[k]) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters()) and model.training
    assert not any(m._forward_hooks or m._forward_pre_hooks or m._backward_hooks for m in model.modules())
    assert not (tmp_path / "cache").exists()   # a GPU plan writes no cache file, whole or half
    assert re.search(r"tunekit\.plan stopped after \d+\.\d s, at the plan's fake step: KeyboardInterrupt\x1b\[K\n$",
                     err.text)
    monkeypatch.setattr(where, "step_loss" if phase == "components" else "_loss", original)
    again = tunekit.plan(model, "T4", micro_batch=2, seq_len=32, checkpointing=True, verbose=False)
    assert again.fits and again.peak_bytes > 0   # the next plan runs as if none had been stopped


def test_a_gpu_plan_runs_no_cpu_calibration(monkeypatch, tmp_path):
    from tunekit.measure import peaks, stream

    monkeypatch.setenv("TUNEKIT_CACHE", str(tmp_path / "cache"))

    def refused(*a, **k):
        raise AssertionError("a GPU plan calibrated this CPU")

    for mod, name in ((peaks, "calibrate"), (peaks, "resolve_peak"), (stream, "measure_stream")):
        monkeypatch.setattr(mod, name, refused)
    p = tunekit.plan(tunekit.GPTConfig.preset("cpu-tiny"), "A100", precision="bf16", micro_batch=2, seq_len=32)
    assert p.expected is not None and p.expected.step_s > 0
    assert not (tmp_path / "cache").exists()


def test_the_advice_fakes_single_gpu_options_without_the_components_pass(monkeypatch):
    calls = []
    original = plan_step._components

    def counted(model, batch, setting, say):
        calls.append((setting.micro_batch, setting.checkpointing, setting.weights, setting.optimizer))
        return original(model, batch, setting, say)

    monkeypatch.setattr(plan_step, "_components", counted)
    p = tunekit.plan(tunekit.GPTConfig.preset("cpu-tiny"), "H100 SXM", precision="bf16", micro_batch=48000,
                     seq_len=128, verbose=False)
    # the plan's own step is measured by component, and the options that fit no single GPU, placed over
    # FSDP (rank 0's share of each component), fewest changes first: 8-bit AdamW, bf16 weights, SGD (the
    # optimizer's second level), bf16 with 8-bit AdamW, bf16 with SGD. Those that fit one GPU (the
    # micro-batch halved, checkpointing) and every superset of them are placed by their peak alone
    assert calls == [(48000, False, None, "adamw"), (48000, False, None, "adamw_8bit"),
                     (48000, False, "bf16", "adamw"), (48000, False, None, "sgd"),
                     (48000, False, "bf16", "adamw_8bit"), (48000, False, "bf16", "sgd")]
    assert [o.label for o in p.advice] == ["micro_batch=24000, grad_accum=2", "checkpointing=True"]
    # an option's total is that of the plan of its setting, whose components are measured
    best = p.advice[0]
    assert tunekit.plan(tunekit.GPTConfig.preset("cpu-tiny"), "H100 SXM", setting=best.setting,
                        verbose=False).total_bytes == best.total_bytes


def test_the_plan_and_its_micro_batch_search_share_one_fake_step_per_shape(monkeypatch):
    from tunekit.planning import planner

    faked = []
    original = planner.fake_step

    def counted(model, kind, cfg, setting, micro_batch, *args, **kwargs):
        faked.append(micro_batch)
        return original(model, kind, cfg, setting, micro_batch, *args, **kwargs)

    monkeypatch.setattr(planner, "fake_step", counted)
    p = tunekit.plan(tunekit.GPTConfig.preset("cpu-tiny"), "T4", micro_batch=1, seq_len=32, search=True,
                     search_limit=4, verbose=False)
    # the search doubles from 1 up to the limit, all fitting: 1 (the plan's own step, not faked again), 2, 4
    assert faked == [1, 2, 4] and p.max_micro_batch == 4


def test_a_wait_in_a_notebook_is_one_display_updated_and_the_heartbeat_draws_a_silent_phase(monkeypatch):
    import threading

    import IPython
    import IPython.display

    shown, drawn = [], threading.Event()

    class Handle:
        def update(self, obj):
            shown.append(obj.data)
            drawn.set()

    class Shell:
        execution_count = 3
        kernel = object()

    monkeypatch.setattr(IPython, "get_ipython", lambda: Shell())
    monkeypatch.setattr(IPython.display, "display", lambda *a, **k: Handle())
    monkeypatch.setattr(progress._NotebookView, "_cell", {})
    now = [0.0]
    monkeypatch.setattr(progress, "clock", lambda: now[0])
    monkeypatch.setattr(progress, "HEARTBEAT_S", 1e9)
    with progress.WaitProgress("tunekit.plan") as w:
        w.at("advice: combination 1 of at most 4 (optimizer='sgd')", 0.25)
        assert shown == []                       # 0 s in: under SHOW_AFTER_S, nothing yet
        now[0] = 2.5
        w.say("live bytes, backward")
    assert ("tunekit.plan: advice: combination 1 of at most 4 (optimizer=&#x27;sgd&#x27;): live bytes, backward"
            " · 2.5 s <progress value='0.250'") in shown[0]
    assert "tunekit.plan: done in 2.5 s" in shown[-1] and len(shown) == 2
    # no news for a while: the heartbeat thread draws the phase with the time gone
    monkeypatch.setattr(progress, "HEARTBEAT_S", 0.01)
    now[0], shown[:] = 0.0, []
    drawn.clear()
    with progress.WaitProgress("tunekit.plan") as w:
        w.at("the plan's fake step")
        now[0] = 7.0
        assert drawn.wait(30)
    assert "tunekit.plan: the plan&#x27;s fake step · 7.0 s" in shown[0]
