"""FSDP's own memory-bound work per micro-step (planning/fsdp_work.py): exact records, and where a plan shows them."""
import pytest

import tunekit
from tunekit.core import registry
from tunekit.planning.fsdp_work import FSDP1, FSDP1_AUTOCAST, FSDP2, fsdp_records, predivide_factor

BF16, FP16, FP32 = registry.BF16, registry.FP16, registry.FP32
# two units over 2 ranks: (4, 3) + (3,), then (5, 3)
UNITS = [[(4, 3), (3,)], [(5, 3)]]


def by_name(recs) -> dict:
    out: dict = {}
    for name, kind, phase, flops, nbytes, dims, _ in recs:
        assert (kind, flops, dims) == ("memory", 0, None)
        out.setdefault((name, phase), []).append(nbytes)
    return out


def test_fsdp2_records_of_a_tiny_plan():
    got = by_name(fsdp_records(FSDP2, UNITS, shard=2, passes=2, weights=FP32, param=BF16, reduce=FP32, grad_accum=2))
    # unit 1 padded on dim 0: (4, 3) 12 + (3,) 4 = 16 gathered, 8 a rank; unit 2: (6, 3) 18 gathered, 9 a rank
    # copy-in: the shard cast fp32 -> bf16 (4 + 2 B), then copied into the gather buffer (2 + 2 B); copy-out: the
    # gathered bf16 buffer into each parameter (2 + 2 B); once in forward and again in backward (FULL_SHARD)
    for phase in ("forward", "backward"):
        assert got[("fsdp2: all-gather copy-in (cast to bf16)", phase)] == [8 * 6, 9 * 6]
        assert got[("fsdp2: all-gather copy-in (into the gather buffer)", phase)] == [8 * 4, 9 * 4]
        assert got[("fsdp2: all-gather copy-out (split into parameters)", phase)] == [16 * 4, 18 * 4]
    # reduce-scatter copy-in: the bf16 gradients chunk-cat into the fp32 buffer (2 + 4 B); fp32 reduces by AVG: no
    # divide; accumulation: the fp32 shard read twice and written (12 B), half the micro-steps at grad_accum=2
    assert got[("fsdp2: reduce-scatter copy-in (chunk-cat, cast to fp32)", "backward")] == [16 * 6, 18 * 6]
    assert got[("fsdp2: sharded gradient accumulation (+=)", "backward")] == [8 * 12 / 2, 9 * 12 / 2]
    assert len(got) == 8


def test_fsdp2_divides_only_in_fp16():
    # fp16 over 8 ranks: pre-divide by 4 (8 x 2 x 2 B), post-divide by 2 (1 x 2 x 2 B); one step, no accumulation
    got = by_name(fsdp_records(FSDP2, [[(8, 1)]], shard=8, passes=1, weights=FP16, param=FP16, reduce=FP16))
    assert got == {("fsdp2: all-gather copy-in (into the gather buffer)", "forward"): [4],
                   ("fsdp2: all-gather copy-out (split into parameters)", "forward"): [32],
                   ("fsdp2: reduce-scatter copy-in (chunk-cat)", "backward"): [32],
                   ("fsdp2: gradient pre-divide", "backward"): [32],
                   ("fsdp2: gradient post-divide", "backward"): [4]}


def test_fsdp1_pure_records():
    got = by_name(fsdp_records(FSDP1, UNITS[:1], shard=2, passes=2, weights=FP32, param=BF16, reduce=BF16,
                               grad_accum=2))
    # one flat parameter of 15 elements, padded to 16: 8 a rank; its views need no copy-out
    assert got == {("fsdp1: all-gather copy-in (cast to bf16)", "forward"): [8 * 6],
                   ("fsdp1: all-gather copy-in (cast to bf16)", "backward"): [8 * 6],
                   ("fsdp1: flat gradient (cat of the parameters' gradients)", "backward"): [15 * 2 * 2],
                   ("fsdp1: reduce-scatter input padding (F.pad)", "backward"): [(15 + 16) * 2],
                   ("fsdp1: gradient pre-divide", "backward"): [16 * 2 * 2],   # 2 ranks: by 2, post-divide by 1
                   ("fsdp1: reduced gradient cast to fp32", "backward"): [8 * (2 + 4)],
                   ("fsdp1: sharded gradient accumulation (+=)", "backward"): [8 * 12 / 2]}


def test_fsdp1_autocast_records():
    # fp32 gathered (no copy-in cast), fp32 flat gradient cat (4 + 4 B), cast to bf16 (4 + 2 B), no padding (16)
    got = by_name(fsdp_records(FSDP1_AUTOCAST, [[(4, 4)]], shard=8, passes=2, weights=FP32, param=FP32, reduce=BF16))
    assert got == {("fsdp1: flat gradient (cat of the parameters' gradients)", "backward"): [16 * 8],
                   ("fsdp1: gradient cast to bf16", "backward"): [16 * 6],
                   ("fsdp1: gradient pre-divide", "backward"): [16 * 4],     # 8 ranks: by 4, then by 2
                   ("fsdp1: gradient post-divide", "backward"): [2 * 4],
                   ("fsdp1: reduced gradient cast to fp32", "backward"): [2 * 6]}


def test_predivide_factor():
    assert [predivide_factor(n) for n in (1, 2, 8, 64, 128)] == [1, 2, 4, 8, 16]


def test_unknown_version_refused():
    with pytest.raises(ValueError, match="fsdp must be one of"):
        fsdp_records("fsdp3", UNITS, 2, 2, FP32, BF16, FP32)


CFG = tunekit.GPTConfig(vocab_size=512, n_layer=2, n_head=2, n_embd=64, block_size=64)


def fsdp_rows(p) -> dict:
    df = p.expected.by_op
    return dict(zip(df.op[df.op.str.contains(": ")], df.calls[df.op.str.contains(": ")]))


def test_a_sharded_plan_shows_fsdp_rows_and_one_device_none():
    kw = dict(micro_batch=2, seq_len=64, verbose=False)
    p = tunekit.plan(CFG, "H100 SXM", parallel="fsdp", world_size=2, **kw)
    # three units (two blocks, the root's own), gathered in forward and backward: 6 calls of each copy
    assert fsdp_rows(p) == {"fsdp2: all-gather copy-in (cast to bf16)": 6,
                            "fsdp2: all-gather copy-in (into the gather buffer)": 6,
                            "fsdp2: all-gather copy-out (split into parameters)": 6,
                            "fsdp2: reduce-scatter copy-in (chunk-cat, cast to fp32)": 3}
    assert any(n.startswith("fsdp2: FSDP's own copies") for n in p.expected.notes)
    assert fsdp_rows(tunekit.plan(CFG, "H100 SXM", **kw)) == {}
    old = tunekit.plan(CFG, "H100 SXM", parallel="fsdp", world_size=2, fsdp="fsdp1_autocast", grad_accum=4, **kw)
    assert set(fsdp_rows(old)) == {"fsdp1: flat gradient (cat of the parameters' gradients)",
                                   "fsdp1: gradient cast to bf16", "fsdp1: gradient pre-divide",
                                   "fsdp1: reduced gradient cast to fp32", "fsdp1: sharded gradient accumulation (+=)"}
    with pytest.raises(ValueError, match="fsdp"):
        tunekit.plan(CFG, "H100 SXM", parallel="fsdp", world_size=2, fsdp="fsdp3", **kw)


def test_fsdp2_one_llama_layer_in_bytes():
    # a Llama layer at d_model 8 (q, o 8x8; k, v 4x8: 2 KV heads of 2; gate, up 16x8; down 8x16; two norms of 8) over
    # 2 ranks, torchtitan's MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32) on fp32 weights, FULL_SHARD:
    # 64 + 32 + 32 + 64 + 3 x 128 + 2 x 8 = 592 elements (every dim 0 even: no padding), 296 a rank
    layer = [[(8, 8), (4, 8), (4, 8), (8, 8), (16, 8), (16, 8), (8, 16), (8,), (8,)]]
    recs = fsdp_records(FSDP2, layer, shard=2, passes=2, weights=FP32, param=BF16, reduce=FP32)
    got = {k: sum(v) for k, v in by_name(recs).items()}
    # each all-gather (forward, backward): the shard cast 296 x (4 + 2) = 1776, copied into the buffer 296 x 2 x 2 =
    # 1184, the gathered buffer split into the parameters 592 x 2 x 2 = 2368; backward: the bf16 gradients chunk-cat
    # into the fp32 reduce buffer 592 x (2 + 4) = 3552; fp32 reduces by NCCL's AVG (no divide), the reduced fp32
    # shard is the weights' dtype (no cast), one micro-step (no accumulation)
    gathers = (("fsdp2: all-gather copy-in (cast to bf16)", 1776),
               ("fsdp2: all-gather copy-in (into the gather buffer)", 1184),
               ("fsdp2: all-gather copy-out (split into parameters)", 2368))
    assert got == {**{(n, ph): b for ph in ("forward", "backward") for n, b in gathers},
        ("fsdp2: reduce-scatter copy-in (chunk-cat, cast to fp32)", "backward"): 3552}
    assert sum(got.values()) == 2 * (1776 + 1184 + 2368) + 3552 == 14208   # 24 B a parameter over 2 ranks


def test_a_sharded_step_is_counted_and_stepped_on_the_half_model_only(monkeypatch):
    from tunekit.planning import step as step_module

    seen = {"_counted": [], "_timeline": []}

    def spy(name):
        real = getattr(step_module, name)

        def seen_by(model, *args, **kwargs):
            seen[name].append(str(next(model.parameters()).dtype))
            return real(model, *args, **kwargs)
        return seen_by

    for name in seen:
        monkeypatch.setattr(step_module, name, spy(name))
    kw = dict(micro_batch=2, seq_len=64, verbose=False)
    sharded = tunekit.plan(CFG, "H100 SXM", parallel="fsdp", world_size=2, **kw)
    # FSDP2 computes on its bf16 param dtype: only the half model's step is counted and stepped for its live bytes
    # (the fp32 model's, which in_param_dtype replaces, are not made: its held bytes only)
    assert seen == {"_counted": ["torch.bfloat16"], "_timeline": ["torch.bfloat16"]}
    half = tunekit.plan(CFG, "H100 SXM", weights="bf16", **kw)
    own = {r[0]: r[2] for r in sharded.expected.rows if ": " not in r[0] and r[1] not in ("optimizer", "communication")}
    assert own == {r[0]: r[2] for r in half.expected.rows if r[1] not in ("optimizer", "communication")}
