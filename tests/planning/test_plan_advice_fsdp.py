"""The advice of an unsharded plan prices an FSDP option as the plan of that option does: FSDP2 on a
half param dtype steps the half model (planning.step.in_param_dtype: no autocast weight casts) beside
FSDP's own casts and copies (planning.fsdp_work), counted once. No timing is compared."""
import tunekit


def test_an_fsdp_options_expected_step_is_the_direct_plan_of_its_setting():
    # 7 layers of 12 x 8192^2 = 805M parameters each (5.6B): fp32 weights and AdamW's two moments with
    # fp32 gradients, 16 bytes a parameter, 90 GB, past an H100's 80 GB; FSDP over 2 holds half of it
    cfg = tunekit.GPTConfig(n_layer=7, n_head=64, n_embd=8192, block_size=128)
    p = tunekit.plan(cfg, "H100 SXM", precision="bf16", micro_batch=1, seq_len=128, verbose=False)
    assert not p.fits
    sharded = [o for o in p.advice if o.setting.parallel == "fsdp"]
    assert [o.label for o in sharded] == ["parallel='fsdp', world_size=2"]
    option = sharded[0]
    direct = tunekit.plan(cfg, "H100 SXM", setting=option.setting, verbose=False)
    # the same bytes and, op by op, the same expected micro-step (before: the fp32 model's autocast
    # count, its weight casts, plus FSDP's cast to bf16: 23% slower than the plan of the same setting)
    assert direct.total_bytes == option.total_bytes
    assert direct.expected.rows == option.expected.rows
    assert direct.expected.step_s == option.expected.step_s
