"""Dropout's random fill in a CPU plan (issue 42 item 3): CPU's F.dropout draws bernoulli_ on a
noise tensor of its input's shape, at the shape it runs (attention's at [batch, heads, seq, seq]),
costed at this CPU's measured elements per second (measure.rng), not at the streaming bandwidth."""
import warnings

import pytest

import tunekit
from tunekit.core.efficiency import Figures
from tunekit.core.expected import op_seconds
from tunekit.planning.ops import RooflineCounter


def _fig(**kw):
    base = dict(name="toy", peak_tflops=1.0, mamf_tflops=0.5, mamf_source="m", bandwidth_tbs=0.05,
                bandwidth_source="b", launch_s=4e-6, launch_source="l", host_bound=True)
    return Figures(**{**base, **kw})


# a fp32 noise tensor of 2^18 elements, filled in place: read and written, 1 MiB each
FILL = ("bernoulli_", "memory", "forward", 0, 2 * 2**20, None, 4, (((1, 2**20),), ((1, 2**20),)))


def test_the_random_fill_is_costed_per_element_where_that_is_slower():
    s, bound, source = op_seconds(_fig(rng_rate=1.7e8, rng_source="rng"), FILL, None)
    # 2^18 elements / 1.7e8 per s = 1.542e-3 s (the bytes: 2 MiB / 0.05 TB/s = 4.19e-5 s)
    assert s == pytest.approx(2**18 / 1.7e8) and (bound, source) == ("compute", "rng")
    # no measured rate (a GPU's figures): its bytes at the bandwidth, as before
    s, bound, _ = op_seconds(_fig(), FILL, None)
    assert s == pytest.approx(2 * 2**20 / 0.05e12) and bound == "memory"


def test_a_gpt2_plan_draws_every_dropout_at_its_shape(fixed_cpu):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    # 2 layers, 2 heads, width 16, batch 2, seq 32, dropout 0.1 everywhere (GPT2Config's default)
    cfg = GPT2Config(n_layer=2, n_embd=16, n_head=2, vocab_size=64, n_positions=64)
    rows = {}
    for attention in ("eager", "sdpa"):
        cfg._attn_implementation = attention
        with warnings.catch_warnings(), RooflineCounter() as counter:
            warnings.simplefilter("ignore")
            GPT2LMHeadModel(cfg).train()(torch.zeros(2, 32, dtype=torch.long))
        fills = [r for r in counter.ops if r[0] == "bernoulli_"]
        # per layer: attention's weights 2 x 2 x 32 x 32 = 4096 elements, two residual dropouts
        # 2 x 32 x 16 = 1024 each; the embeddings' one 1024: 2 x 4096 + 5 x 1024 = 13312 elements
        assert sorted(sum(b for _, b in r[7][1]) // 4 for r in fills) == [1024] * 5 + [4096] * 2
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            p = tunekit.plan(cfg, "cpu", micro_batch=2, seq_len=32, attention=attention)
        row = p.expected.by_op.set_index("op").loc["bernoulli_"]
        rows[attention] = row
        # 13312 / 1.7e8 = 7.831e-5 s of filling, plus each of the 7 calls' 4 us dispatch = 2.8e-5 s
        assert row.calls == 7 and row.bound == "compute"
        assert row.expected_s == pytest.approx(13312 / 1.7e8 + 7 * 4e-6)
    assert rows["eager"].expected_s == rows["sdpa"].expected_s   # CPU's SDPA with dropout: the math path's fill


def test_a_gpu_plan_keeps_cudas_dropout():
    from transformers import GPT2Config

    cfg = GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=128, n_positions=64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        p = tunekit.plan(cfg, "H100 SXM", precision="bf16", micro_batch=2, seq_len=64, attention="eager")
    ops = set(p.expected.by_op.op)
    # CUDA's native_dropout (a 1-byte mask), no CPU bernoulli_ costed at a CPU's rate
    assert "native_dropout" in ops and "bernoulli_" not in ops
