"""A sharded plan over fp32 weights under a half autocast computes on FSDP's half param dtype
(planning.step.in_param_dtype): the half model's live bytes with the fp32 model's static lines.
No timing is compared."""
import pytest

import tunekit
from tunekit.planning.step import PARAM_DTYPE_NOTE, FakeStep, in_param_dtype


def _step(detail, held, all_grads, **kw):
    return FakeStep(peak=max(b for b, _, _ in detail.values()), peak_at="", grads_at_peak=0.0, state_scalars=0.0,
                    phase_detail=detail, phase_peaks={}, timeline=[("forward", 50.0)], units=[], held=held,
                    all_grads=all_grads, casts_at={"forward": 7.0}, **kw)


def test_the_half_steps_live_bytes_take_the_fp32_models_static_lines():
    full = _step({"forward": (300.0, "f", 0.0), "backward": (320.0, "b", 40.0)}, held=60.0, all_grads=40.0,
                 components={"weights": 4.0}, executed=9.0)
    half = _step({"forward": (90.0, "hf", 0.0), "backward": (100.0, "hb", 10.0)}, held=30.0, all_grads=20.0)
    mixed = in_param_dtype(full, half)
    # backward: 100 + (60 - 30) + 10 x (40/20 - 1) = 140 with 20 of gradients; forward: 90 + 30 = 120
    assert mixed.phase_detail == {"forward": (120.0, "hf", 0.0), "backward": (140.0, "hb", 20.0)}
    assert (mixed.peak, mixed.peak_at, mixed.grads_at_peak) == (140.0, "hb", 20.0)
    assert mixed.phase_peaks == {"forward": 120.0, "backward": 140.0}
    assert mixed.casts_at == {"forward": 0.0, "backward": 0.0}        # FSDP's gathered parameters replace them
    assert mixed.timeline == [("forward", 80.0)]                       # 50 + 30
    assert (mixed.components, mixed.executed) == ({"weights": 4.0}, 9.0)   # the fp32 step's lines and count
    assert PARAM_DTYPE_NOTE in mixed.notes and PARAM_DTYPE_NOTE not in full.notes


@pytest.mark.parametrize("parallel", ["fsdp", "ddp"])
def test_only_a_sharded_autocast_plan_computes_in_the_param_dtype(parallel):
    cfg = tunekit.GPTConfig.preset("cpu-tiny")
    kw = dict(micro_batch=2, seq_len=64, parallel=parallel, world_size=2, verbose=False)
    autocast = tunekit.plan(cfg, "H100 SXM", precision="bf16", **kw)
    assert (PARAM_DTYPE_NOTE in autocast.notes) == (parallel == "fsdp")
    fp32 = tunekit.plan(cfg, "H100 SXM", precision="fp32", **kw)     # nothing to cast: planned as before
    assert PARAM_DTYPE_NOTE not in fp32.notes
    if parallel == "fsdp":   # the half model's activations: below autocast's fp32 residual stream
        assert autocast.peak_bytes < fp32.peak_bytes
