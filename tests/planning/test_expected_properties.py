"""The CPU expectation as a function of the setting and a calibration recorded once (issue 39):
read from the cache as it is, the same plan twice to the digit, a busy calibration said by a note;
and three properties any step model must keep, on a fixed calibration (the ``fixed_cpu`` cache,
so every figure is exact and nothing is timed here): checkpointing never makes the expected step
faster, a bigger micro-batch never makes it faster, and more GPUs under FSDP never raise the
planned memory per GPU."""
import warnings

import pytest

import tunekit
from tunekit.core.notes import of_kind
from tunekit.models.gpt import PRESETS


def _hf(kind):
    from transformers import GPT2Config, LlamaConfig

    if kind == "llama":   # a Llama-class body: RMSNorm, rotary, SwiGLU, GQA 4/2 heads
        return LlamaConfig(vocab_size=512, hidden_size=128, intermediate_size=344, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    return GPT2Config(vocab_size=512, n_embd=128, n_layer=2, n_head=4, n_positions=256)   # GPT-2-class


# the presets of GPT-2's and a 1B body's depth take minutes of fake steps on 2 loaded cores: slow
BIG = ("gpt2-124m", "gpt2-350m", "gpt-1b")
MODELS = [pytest.param(n, marks=pytest.mark.slow) if n in BIG else n for n in PRESETS] + ["llama", "gpt2"]


def _target(name):
    return tunekit.GPTConfig.preset(name) if name in PRESETS else _hf(name)


def _plan(name, device="cpu", **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return tunekit.plan(_target(name), device, **kw)


@pytest.mark.parametrize("name", MODELS)
def test_checkpointing_and_a_bigger_micro_batch_never_make_the_expected_step_faster(fixed_cpu, name):
    plain, ckpt, bigger = (_plan(name, precision="fp32", micro_batch=mb, seq_len=32, checkpointing=ck)
                           for mb, ck in ((1, False), (1, True), (2, False)))
    assert plain.expected.step_s <= ckpt.expected.step_s, (plain.expected.by_op, ckpt.expected.by_op)
    assert plain.expected.step_s <= bigger.expected.step_s, (plain.expected.by_op, bigger.expected.by_op)


@pytest.mark.parametrize("name", MODELS)
def test_more_gpus_under_fsdp_never_raise_the_memory_per_gpu(name):
    totals = [_plan(name, "H100 SXM", precision="bf16", micro_batch=1, seq_len=32, parallel="fsdp",
                    world_size=w).total_bytes for w in (2, 4, 8)]
    assert totals == sorted(totals, reverse=True), totals


def test_the_same_cpu_plan_twice_gives_the_same_figures(fixed_cpu):
    a, b = (_plan("cpu-tiny", precision="fp32", micro_batch=4, seq_len=64) for _ in range(2))
    assert a.expected.step_s == b.expected.step_s and a.expected.rows == b.expected.rows
    assert not of_kind(a.notes, "expected.busy_figures")


def test_a_plan_from_busy_calibrations_says_so_and_uses_them_as_they_are(fixed_cpu):
    quiet = _plan("cpu-tiny", precision="fp32", micro_batch=4, seq_len=64).expected.step_s
    fixed_cpu("busy")   # the same figures, recorded as taken on a busy machine: read, not measured again
    busy = _plan("cpu-tiny", precision="fp32", micro_batch=4, seq_len=64)
    assert busy.expected.step_s == quiet
    [note] = of_kind(busy.notes, "expected.busy_figures")
    # the note names the calls that measure again: the sweeps, and the matmul peak where it was busy too
    assert "tunekit.measure.stream.measure_stream(refresh=True)" in str(note)


def test_a_plan_from_busy_calibrations_says_so_though_their_trials_ran_ahead_of_the_load(fixed_cpu):
    fixed_cpu("busy", "realtime")   # trials at real-time priority share the host all the same
    busy = _plan("cpu-tiny", precision="fp32", micro_batch=4, seq_len=64)
    [note] = of_kind(busy.notes, "expected.busy_figures")
    assert "tunekit.measure.stream.measure_stream(refresh=True)" in str(note)
    assert "tunekit.calibrate('fp32', 'cpu', force=True)" in str(note)


def test_the_stream_cache_is_measured_again_only_on_request(fixed_cpu):
    from tunekit.measure.stream import measure_stream

    fixed_cpu("busy")
    assert measure_stream().verdict == "busy" and measure_stream().op_s == 4e-6   # as cached: nothing measured
    with pytest.raises(AssertionError, match="was measured"):   # the fixture's sweep functions refuse to run
        measure_stream(refresh=True)


def test_a_figure_is_the_fastest_of_trials_taken_while_they_still_find_a_faster_one():
    from tunekit.measure.stream import MAX_TRIES, fastest

    times = iter([5.0, 4.0, 3.0, 3.5, 3.0, 2.0, 3.0, 3.0, 3.0, 2.99, 3.0] + [9.0] * 100)
    calls = []

    def trial():
        calls.append(1)
        return next(times)

    # 5 tries at least; the 2.0 at the 6th resets the count, then 5 in a row none faster by 1% (2.99 is
    # not 1% under 2.0): 6 + 5 = 11 trials
    assert fastest(trial, 5) == 2.0 and len(calls) == 11
    # a trial always 1% faster than the last keeps it going up to the cap
    faster = iter(0.98 ** i for i in range(1000))
    calls.clear()
    assert fastest(lambda: calls.append(1) or next(faster), 5) == 0.98 ** (MAX_TRIES - 1) and len(calls) == MAX_TRIES
