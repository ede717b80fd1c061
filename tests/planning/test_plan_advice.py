"""What a plan advises when a step does not fit (planning/advice.py): combinations of changes over
fake steps, supersets of one that fits pruned, those that fit ranked by expected tokens/s per GPU,
each with its caveats as Notes of declared kinds. No timing is compared."""
import dataclasses

import pytest

import tunekit
from tunekit.core.expected import Expected
from tunekit.core.notes import kind_of, of_kind
from tunekit.core.setting import Setting
from tunekit.planning.advice import Place, caveats, placements, search_changes


@dataclasses.dataclass
class _Step:
    """A made-up step: what the search reads of a `planning.step.FakeStep` (its FLOPs, once counted)."""

    executed: float | None = None
    ops: list | None = None

    def has(self, part: str) -> bool:
        return getattr(self, part) is not None


@dataclasses.dataclass
class _Placed:
    """A made-up placement: what the search reads of a `planning.record.Placed`."""

    total: float


def _search():
    """A search over made-up steps: 150 bytes at first on a 100-byte card; checkpointing saves 60,
    bf16 weights 40, 8-bit AdamW 15 (2 bytes a parameter for 8), SGD 10 (4 for 8), each halving of the
    micro-batch 20; FSDP over N holds total/N + 5."""
    setting = Setting(precision="bf16", micro_batch=4, seq_len=8, optimizer="adamw")
    faked, counted = [], []

    def bytes_of(s):
        return 150 - 60 * s.checkpointing - 40 * (s.weights == "bf16") - 10 * (s.optimizer == "sgd") \
            - 15 * (s.optimizer == "adamw_8bit") \
            - 20 * {4: 0, 2: 1, 1: 2}[s.micro_batch]

    def fake(s):
        faked.append(s)
        return _Step()

    def count(s, step):
        counted.append(s)
        step.ops, step.executed = [], s.micro_batch * (15.0 if s.checkpointing else 10.0)

    def place(step, s):
        return _Placed(bytes_of(s) / s.world_size + 5 if s.parallel else bytes_of(s))

    def expect(step, s, placed):   # 1,000 tokens/s over a 1 s micro-step, 0.2 s of it the update
        return Expected(step_s=1.0, tokens_per_s=1000.0, mfu=0.5,
                        rows=[("mm", "matmul", 1, 0.8, "compute", ""), ("optimizer step", "optimizer", 1, 0.2,
                                                                         "memory", "")])

    base = _Step(executed=40.0, ops=[])
    tried, ranked, pruned = search_changes(setting, base, 100.0, fake=fake, count=count, place=place,
                                           expect=expect, places=placements(setting, True))
    return setting, faked, counted, tried, ranked, pruned


def test_combinations_are_searched_supersets_of_what_fits_pruned_and_placement_needs_no_fake_step():
    setting, faked, counted, tried, ranked, pruned = _search()
    # 2 (checkpointing) x 2 (weights) x 3 (optimizer: adamw, adamw_8bit, sgd) x 3 (micro-batch 4, 2, 1) = 36
    # combinations. The plan over FSDP 2 fits (150 / 2 + 5 = 80): from then on no combination is placed on
    # 2 or more. Checkpointing alone fits (90): its 1 x 2 x 3 x 3 - 1 = 17 supersets are pruned; bf16+mb2
    # (150 - 40 - 20 = 90), bf16+8bit (150 - 40 - 15 = 95: 5% free, with room) and 8bit+mb1 (150 - 15 - 40 =
    # 95) fit: bf16+mb1, bf16+8bit+mb2, bf16+sgd (sgd is the level past 8bit), sgd+mb1, bf16+8bit+mb1,
    # bf16+sgd+mb2 and bf16+sgd+mb1 are pruned. 17 + 7 = 24 pruned, 35 - 24 = 11 faked (the plan's own given).
    adds = [k for k in pruned if k.why == "adds_to_fit"]
    assert len(adds) == 24 and len(faked) == 11 and "checkpointing=True, weights='bf16'" in [k.changes for k in adds]
    assert str(adds[0]) == ("checkpointing=True, micro_batch=2, grad_accum=2 on one GPU or FSDP over 2, 4, 8, 16 "
                            "(2 nodes), 32 (4 nodes): adds changes to checkpointing=True, which fits with room (each "
                            "costs speed, numerics or convergence)")
    # the 12 combinations tried: none on more GPUs than a fit with room of it or of a subset (the plan over 2)
    more = {k.changes: k.gpus for k in pruned if k.why == "more_gpus"}
    assert len(more) == 12 and more[""] == (4, 8, 16, 32) and more["checkpointing=True"] == (2, 4, 8, 16, 32)
    assert all("parallel" not in o.label for o in tried[5:])   # the FSDP placements are the plan's own step's
    assert [o.label for o in tried[:4]] == ["parallel='fsdp', world_size=2", "micro_batch=2, grad_accum=2",
                                            "optimizer='adamw_8bit'", "weights='bf16'"]
    assert tried[2].total_bytes == 135 and not tried[2].fits   # 150 - 15: 8-bit AdamW alone is not enough
    # only what fits is counted: 5 options, one of them the plan's own step (already counted)
    assert len(counted) == 4 and all(o.fits == (o.flops_per_token == o.flops_per_token) for o in tried[1:])
    # ranked by expected tokens/s per GPU over an optimizer step: accum x 1,000 tokens over
    # accum x 0.8 s + 0.2 s: 4,000 / 3.4 = 1,176.5 (mb 1 x 4), 2,000 / 1.8 = 1,111.1 (mb 2 x 2), then
    # 1,000 each: one GPU before two, fewer bytes first (checkpointing 90, bf16+8bit 95, FSDP 2's 80 on 2)
    assert [o.label for o in ranked] == ["optimizer='adamw_8bit', micro_batch=1, grad_accum=4",
                                         "weights='bf16', micro_batch=2, grad_accum=2", "checkpointing=True",
                                         "weights='bf16', optimizer='adamw_8bit'", "parallel='fsdp', world_size=2"]
    assert ranked[0].tokens_per_s == pytest.approx(4000 / 3.4) and ranked[1].tokens_per_s == pytest.approx(2000 / 1.8)
    assert ranked[2].flops_per_token == 1.5 and ranked[2].setting == setting.replace(checkpointing=True)


def test_the_search_is_bounded_and_says_what_it_left():
    setting = Setting(precision="bf16", micro_batch=4, seq_len=8, optimizer="adamw")
    faked = []

    def fake(s):
        faked.append(s)
        return _Step()

    # nothing fits anywhere (1,000 bytes on a 100-byte card): every combination would be faked
    tried, ranked, skipped = search_changes(setting, _Step(executed=40.0, ops=[]), 100.0, fake=fake,
                                            count=None, place=lambda st, s: _Placed(1000.0), expect=None,
                                            places=placements(setting, False), limit=5)
    # 36 combinations: the plan's own, 5 faked, 30 left at the bound, each said. Fewest changes first: the
    # four single changes, then micro_batch=1 (the second level of one dimension); 8-bit AdamW with the
    # micro-batch halved is the first left
    assert len(faked) == 5 and ranked == [] and len(tried) == 5
    assert [s.micro_batch for s in faked] == [2, 4, 4, 4, 1] and faked[3].checkpointing
    assert [k.why for k in skipped] == ["bound"] * 30
    assert str(skipped[0]) == ("optimizer='adamw_8bit', micro_batch=2, grad_accum=2 on one GPU: the search's bound "
                               "(5 fake steps made, fewest changes first): plan it yourself")


def test_more_gpus_go_over_nodes_and_a_sharded_plan_gets_more_of_them():
    one = Setting(precision="bf16", micro_batch=1, seq_len=8)
    at = [(p.world, p.nodes, p.changes) for p in placements(one, True)]
    # one GPU, then FSDP over 2, 4, 8 in a node of 8 (PER_NODE), 16 and 32 over 2 and 4 nodes (MAX_NODES)
    assert at == [(1, 1, ()), (2, 1, ("parallel='fsdp', world_size=2",)), (4, 1, ("parallel='fsdp', world_size=4",)),
                  (8, 1, ("parallel='fsdp', world_size=8",)), (16, 2, ("parallel='fsdp', world_size=16, nodes=2",)),
                  (32, 4, ("parallel='fsdp', world_size=32, nodes=4",))]
    # a plan FSDP over 8 already: 16 and 32; DDP over 8: FSDP over its own 8 first; HSDP over 16 on 2 nodes
    # (8 a node): FSDP over its 16, then 32; 4 a node over 2 nodes: up to 4 x 4 = 16
    def counts(**layout):
        return [(p.world, p.nodes) for p in placements(one.replace(**layout), True)][1:]

    assert counts(parallel="fsdp", world_size=8) == [(16, 2), (32, 4)]
    assert counts(parallel="ddp", world_size=8) == [(8, 1), (16, 2), (32, 4)]
    assert counts(parallel="hsdp", world_size=16, nodes=2) == [(16, 2), (32, 4)]
    assert counts(parallel="fsdp", world_size=8, nodes=2) == [(16, 4)]
    assert placements(one, False) == [Place(1)] and str(Place(16, 2, ("x",), "fsdp")) == "FSDP over 16 on 2 nodes"


def test_a_sharded_plan_just_over_gets_adamw_8bit_and_more_nodes():
    """The 70B's case in small: FSDP over 8 on one node, checkpointing, bf16 weights, micro-batch 1, AdamW:
    102 bytes on a 100-byte card. Per GPU: 8 of activations + 752 of weights, gradients and state over the
    GPUs (752 / 8 = 94); AdamW's state is half of it (bf16 weights: 2 + 2 + 4 bytes a parameter), 8-bit
    AdamW's a quarter of that (2 bytes of 8), SGD's a half (4 of 8)."""
    setting = Setting(precision="bf16", weights="bf16", checkpointing=True, micro_batch=1, seq_len=8,
                      optimizer="adamw", parallel="fsdp", world_size=8)

    def place(step, s):
        state = {"adamw": 376, "adamw_8bit": 94, "sgd": 188}[s.optimizer]
        return _Placed(8 + (376 + state) / s.world_size)

    def expect(step, s, placed):   # the collectives cross nodes beyond 8: 10% slower a micro-step
        step_s = 1.0 if s.nodes == 1 else 1.1
        return Expected(step_s=step_s, tokens_per_s=1000 / step_s, mfu=0.5, rows=[])

    tried, ranked, skipped = search_changes(setting, _Step(executed=10.0, ops=[]), 100.0, fake=lambda s: _Step(),
                                            count=lambda s, st: setattr(st, "ops", []) or setattr(st, "executed", 10.0),
                                            place=place, expect=expect, places=placements(setting, True))
    # the plan over 16 on 2 nodes: 8 + 752 / 16 = 55; 8-bit AdamW over its 8: 8 + 470 / 8 = 66.75; SGD is
    # past 8-bit AdamW (pruned: it adds to a fit with room), as is 8-bit AdamW over more GPUs
    assert [(o.label, o.total_bytes) for o in ranked] == [
        ("optimizer='adamw_8bit'", 66.75), ("parallel='fsdp', world_size=16, nodes=2", 55.0)]
    assert [round(o.tokens_per_s, 1) for o in ranked] == [1000.0, 909.1]   # 1,000 / 1.1 across nodes
    assert [n.kind for n in ranked[1].notes] == ["advice.gpus"] and "on 2 nodes of 8" in ranked[1].notes[0]
    assert [n.kind for n in ranked[0].notes] == ["advice.optimizer"] and "bitsandbytes" in ranked[0].notes[0]
    assert [(k.changes, k.gpus, k.why) for k in skipped] == [
        ("", (32,), "more_gpus"), ("optimizer='adamw_8bit'", (16, 32), "more_gpus"),
        ("optimizer='sgd'", (8, 16, 32), "adds_to_fit")]


def test_adamw_8bit_is_planned_and_an_optimizer_change_reuses_the_count(monkeypatch):
    import torch

    from tunekit.planning import step as plan_step

    calls = []
    original = plan_step._counted

    def counted(model, adapter, kind, batch, setting, *args, **kw):
        calls.append((setting.weights, setting.optimizer))
        return original(model, adapter, kind, batch, setting, *args, **kw)

    monkeypatch.setattr(plan_step, "_counted", counted)
    with torch.device("meta"):
        net = torch.nn.Sequential(*[torch.nn.Linear(16384, 16384, bias=False) for _ in range(4)])
    kw = dict(batch_fn=lambda b, s: (torch.randn(b, 16384),), micro_batch=8, precision="fp16", verbose=False)
    p = tunekit.plan(net, "T4", **kw)
    # 4 x 16,384^2 = 2^30 fp32 weights: 4 GiB, gradients 4, AdamW's two moments 8: over a T4's 15 GiB
    assert not p.fits and p.components["optimizer_states"] == 8 * 2**30 + 16   # + 4 fp32 step counts
    # fp16 weights, 8-bit AdamW and FSDP over 4 fit; 8-bit AdamW's step is the plan's shape under another
    # optimizer: it takes the plan's count (two counts: the plan's and the fp16 weights' model's)
    assert [o.label for o in p.advice] == ["weights='fp16'", "optimizer='adamw_8bit'", "parallel='fsdp', world_size=4"]
    assert calls == [(None, "adamw"), ("fp16", "adamw")] and p.advice[1].flops_per_token == 1.0
    # 8-bit AdamW's state, as bitsandbytes allocates it: two uint8 moments, 2 x 2^30 bytes, and two fp32
    # absmax per 256 elements, 2 x 4 x 2^30 / 256 = 32 MiB
    eight = tunekit.plan(net, "T4", optimizer="adamw_8bit", **kw)
    assert eight.components["optimizer_states"] == 2 * 2**30 + 32 * 2**20
    assert eight.total_bytes == p.advice[1].total_bytes


def test_adamw_8bit_is_planned_with_bitsandbytes_state():
    import torch

    from tunekit.models.optimizers import state_bytes
    from tunekit.planning.optimizer import plan_optimizer

    lin = torch.nn.Linear(64, 128)
    opt = plan_optimizer("adamw_8bit", lin.parameters())
    lin(torch.randn(2, 64)).sum().backward()
    opt.step()
    # the weight's 8,192 elements (>= 4,096): two uint8 moments, 2 x 8,192, and two fp32 absmax per
    # 256-block, 2 x 32 x 4 = 256; the bias's 128 (< 4,096): two fp32 moments, 2 x 128 x 4 = 1,024
    assert state_bytes(opt) == 16384 + 256 + 1024


def _tight_search(faster_on_more: bool):
    """The 8B's shape in small (fp32 weights, no checkpointing, SGD, micro-batch 1, a 100-byte card):
    the weights and optimizer state shard over FSDP, the activations do not. State 200 bytes (fp32
    weights), 90 (bf16); activations 76, 16 with checkpointing. An expected micro-step of 0.8 s +
    0.8 s / GPUs (the update over each GPU's shard; ``faster_on_more`` False: 1 s everywhere) + 0.3 s
    of recompute with checkpointing, 1,000 tokens each."""
    setting = Setting(precision="bf16", micro_batch=1, seq_len=8, optimizer="sgd")

    def place(step, s):
        state = 90 if s.weights == "bf16" else 200
        return _Placed(state / (s.world_size if s.parallel else 1) + (16 if s.checkpointing else 76))

    def expect(step, s, placed):
        n = s.world_size if s.parallel else 1
        step_s = (0.8 + 0.8 / n if faster_on_more else 1.0) + 0.3 * s.checkpointing
        return Expected(step_s=step_s, tokens_per_s=1000 / step_s, mfu=0.5, rows=[])

    def count(s, step):
        step.ops, step.executed = [], 10.0

    return search_changes(setting, _Step(executed=10.0, ops=[]), 100.0, fake=lambda s: _Step(), count=count,
                          place=place, expect=expect, places=placements(setting, True))


def test_a_tight_fit_keeps_its_neighbours_and_a_fit_with_room_as_fast_comes_first():
    tried, ranked, skipped = _tight_search(faster_on_more=True)
    fits = {o.label: o.total_bytes for o in tried if o.fits}
    # bf16 weights: 90/4 + 76 = 98.5 over FSDP 4 (1.5% free: tight) does not stop the search: FSDP 8 is
    # tried, 90/8 + 76 = 87.25 (12.75% free). The plan itself fits over 16 GPUs on 2 nodes only (200/8 + 76 =
    # 101 over 8, 200/16 + 76 = 88.5 over 16). Checkpointing: 200/4 + 16 = 66 over FSDP 4; both: 90/2 + 16 =
    # 61 over FSDP 2 (under checkpointing's 4)
    assert fits == {"parallel='fsdp', world_size=16, nodes=2": 88.5,
                    "weights='bf16', parallel='fsdp', world_size=4": 98.5,
                    "weights='bf16', parallel='fsdp', world_size=8": 87.25,
                    "checkpointing=True, parallel='fsdp', world_size=4": 66.0,
                    "checkpointing=True, weights='bf16', parallel='fsdp', world_size=2": 61.0}
    # tokens/s per GPU: 1,000 / (0.8 + 0.8/16) = 1,176.5 over 16, 1,000 / (0.8 + 0.8/8) = 1,111.1 over FSDP 8,
    # 1,000 / 1.0 over 4, 1,000 / 1.3 = 769.2 (checkpointing over 4), 1,000 / 1.5 = 666.7 (both over 2)
    assert [round(o.tokens_per_s, 1) for o in ranked] == [1176.5, 1111.1, 1000.0, 769.2, 666.7]
    assert ranked[1].label == "weights='bf16', parallel='fsdp', world_size=8" and ranked[1].notes[-1].kind == \
        "advice.gpus"
    assert [n.kind for n in ranked[2].notes] == ["advice.numerics", "advice.gpus", "advice.tight"]
    # what was not tried, and why: more GPUs than a fit with room (its own or a subset's)
    assert [(k.changes, k.gpus, k.why, k.by) for k in skipped] == [
        ("", (32,), "more_gpus", "parallel='fsdp', world_size=16, nodes=2"),
        ("weights='bf16'", (16, 32), "more_gpus", "weights='bf16', parallel='fsdp', world_size=8"),
        ("checkpointing=True", (8, 16, 32), "more_gpus", "checkpointing=True, parallel='fsdp', world_size=4"),
        ("checkpointing=True, weights='bf16'", (4, 8, 16, 32), "more_gpus",
         "checkpointing=True, weights='bf16', parallel='fsdp', world_size=2")]
    # at equal speed (the update not sharded), the fits with room come first (fewer GPUs first), then the tight
    *_, (first, second, third, *_), _ = _tight_search(faster_on_more=False)
    assert first.tokens_per_s == second.tokens_per_s == third.tokens_per_s == 1000.0
    assert (first.total_bytes, second.total_bytes, third.total_bytes) == (87.25, 88.5, 98.5)


def test_each_option_says_its_caveats_by_kind():
    *_, ranked = _search()[:5]
    kinds = {o.label: [kind_of(n) for n in o.notes] for o in ranked}
    assert kinds == {
        "optimizer='adamw_8bit', micro_batch=1, grad_accum=4": ["advice.optimizer", "advice.accumulation"],  # 5% free
        "weights='bf16', micro_batch=2, grad_accum=2": ["advice.numerics", "advice.accumulation"],   # 10% free
        "checkpointing=True": [],
        "weights='bf16', optimizer='adamw_8bit'": ["advice.numerics", "advice.optimizer"],
        "parallel='fsdp', world_size=2": ["advice.gpus"]}
    s = Setting(precision="bf16", micro_batch=4, seq_len=8)
    tight = ranked[2].__class__(("checkpointing=True",), s.replace(checkpointing=True), 96.0, True)
    assert [kind_of(n) for n in caveats(s, tight, 100.0)] == ["advice.tight"]          # 4% free
    roomy = ranked[2].__class__(("checkpointing=True",), s.replace(checkpointing=True), 95.0, True)
    assert caveats(s, roomy, 100.0) == []                                              # 5% free: not flagged
    sgd = ranked[2].__class__(("optimizer='sgd'",), s.replace(optimizer="sgd"), 90.0, True)
    assert "retune the learning rate" in caveats(s, sgd, 100.0)[0]   # 8-bit AdamW keeps AdamW's hyperparameters


def test_a_plan_that_does_not_fit_ranks_what_fits_by_its_own_expected_speed():
    cfg = tunekit.GPTConfig.preset("cpu-tiny")
    # 48,000 x 128 tokens under bf16 autocast: the activations alone are past an H100 (80 GB)
    p = tunekit.plan(cfg, "H100 SXM", precision="bf16", micro_batch=48000, seq_len=128)
    # halving the micro-batch (twice the accumulation) fits, and so does checkpointing, which recomputes
    assert not p.fits and [o.label for o in p.advice] == ["micro_batch=24000, grad_accum=2", "checkpointing=True"]
    assert p.advice[0].tokens_per_s > p.advice[1].tokens_per_s and p.advice[1].flops_per_token > 1.0
    # 2 x 2 x 3 x 8 micro-batches (48,000 down to 375) = 96 combinations: 2 x 2 x 3 x 7 - 1 = 83 add to the
    # halving, 2 x 3 - 1 = 5 more to checkpointing alone (88); both fits' more GPUs (2): one note says so;
    # another what the advice never tries
    assert len(of_kind(p.notes, "advice.pruned")) == 1 and len(p.not_tried) == 90
    assert len(of_kind(p.notes, "advice.not_searched")) == 1
    best = p.advice[0]
    assert all(kind_of(n).startswith("advice.") for o in p.advice for n in o.notes)
    # the option is the plan of its setting: the same bytes, and the same expected micro-step
    s = best.setting
    again = tunekit.plan(cfg, "H100 SXM", setting=s)
    assert again.fits and again.total_bytes == best.total_bytes
    assert again.expected.step_s == best.expected.step_s
    update = sum(r[3] for r in again.expected.rows if r[1] == "optimizer")
    a, step = s.grad_accum, again.expected.step_s
    assert best.tokens_per_s == pytest.approx(a * again.tokens / (a * (step - update) + update))
    assert "advice     2 combination(s) that fit, by expected" in repr(p) and "1. " + best.label in repr(p)
    pytest.importorskip("ipywidgets")
    from tunekit.planning.panel import advice_lines

    shown = advice_lines(p)   # the dashboard's "Plan for" panel: the best three, each with its caveats
    assert len(shown) == 2 and shown[0].startswith(f"try 1: <code>{best.label}</code>")


@pytest.mark.slow   # the 8B's fake steps: 344 s (72 s of CPU) on 2 cores under a load of ~17 (other sessions)
def test_the_8b_on_h100s_keeps_fsdp_8_beside_its_tight_fsdp_4():
    from transformers import LlamaConfig

    cfg = LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                      num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192)
    p = tunekit.plan(cfg, "H100 SXM", precision="bf16", micro_batch=1, seq_len=8192)
    free = {o.label: round((p.device_memory_bytes - o.total_bytes) / 2**30, 2) for o in p.advice}
    # bf16 weights over FSDP 4 leaves 0.67 GiB of 79.65 (tight): FSDP 8 (6.28 GiB free) and bf16 + 8-bit AdamW
    # over FSDP 4 (4.35 GiB, 5.5%) are tried beside it, and both expected faster per GPU
    four, eight = "weights='bf16', parallel='fsdp', world_size=4", "weights='bf16', parallel='fsdp', world_size=8"
    assert (free[four], free[eight], free["weights='bf16', optimizer='adamw_8bit', parallel='fsdp', world_size=4"]) == (
        0.67, 6.28, 4.35)
    rank = [o.label for o in p.advice]
    assert rank.index(eight) < rank.index(four)
    assert [kind_of(n) for n in p.advice[rank.index(four)].notes][-1] == "advice.tight"
    assert p.not_tried and all(k.why in ("adds_to_fit", "more_gpus") for k in p.not_tried)
    # SGD is tried nowhere 8-bit AdamW fits with room: bf16 + SGD only on one GPU and FSDP 2 (neither fits)
    sgd = next(k for k in p.not_tried if k.changes == "weights='bf16', optimizer='sgd'")
    assert sgd.gpus == (4, 8, 16, 32) and sgd.why == "more_gpus"
    assert len(of_kind(p.notes, "advice.pruned")) == 1 and len(of_kind(p.notes, "advice.not_searched")) == 1
