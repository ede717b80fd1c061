"""One training step under fake tensors, measured by `measure_memory` and counted op by op for
the roofline; the micro-batch search and the alternatives when a step does not fit. Engine layer."""
from __future__ import annotations

import contextlib
import math

import torch

from ...core.plan import COMPONENTS
from ...measure.flops import TunekitFlopCounter
from ...measure.memory import autocast_dtype, measure_memory
from ...measure.model_flops import tensors_in
from ...models.adapters import adapt
from .analytic import FakeStepError, fake_failure
from .module import ModuleTarget
from .target import build

WEIGHTS = {None: None, "fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def alternatives(cfg, kind, setting, step, dev, fixed) -> list:
    """What to change when the step does not fit, each tried as a fake step: (change, its total
    bytes, fits, executed FLOPs against the plan's), most memory saved first."""
    changes = []
    if not setting["checkpointing"]:
        changes.append(("checkpointing=True", dict(checkpointing=True)))
    if setting["weights"] in (None, "fp32") and setting["precision"] in ("bf16", "fp16"):
        changes.append((f"weights={setting['precision']!r}", dict(weights=setting["precision"])))
    if setting["optimizer"] in ("adamw", "adamw_fused"):
        changes.append(("optimizer='sgd'", dict(optimizer="sgd")))
    if setting["micro_batch"] > 1:
        changes.append((f"micro_batch={setting['micro_batch'] // 2}", dict(micro_batch=setting["micro_batch"] // 2)))
    out = []
    for label, change in changes:
        s = dict(setting, **change)
        try:
            alt = fake_step(build(cfg, kind, WEIGHTS[s["weights"]]), kind, cfg, s, s["micro_batch"])
        except ValueError:   # a change that cannot be faked is not offered
            continue
        total = sum(alt["components"].values()) + fixed
        per_token = alt["executed"] / s["micro_batch"] / (step["executed"] / setting["micro_batch"])
        out.append((label, total, total <= dev["memory"], per_token))
    return sorted(out, key=lambda a: a[1])


class RooflineCounter(TunekitFlopCounter):
    """TunekitFlopCounter that also keeps, for each op that does FLOPs (matmuls, attention), its
    FLOPs (causal attention halved) and the bytes it must move (inputs read, outputs written).
    Elementwise ops, norms and casts are left out of the bound: a compiler can fuse them into
    their neighbours, so counting their traffic would make the "bound" a guess about fusion."""

    def __enter__(self):
        self.ops = []   # (op name, flops, bytes)
        return super().__enter__()

    def _count_flops(self, func_packet, out, args, kwargs):
        before = self.get_total_flops()
        result = super()._count_flops(func_packet, out, args, kwargs)
        flops = self.get_total_flops() - before
        if flops:
            moved = sum(t.nbytes for t in tensors_in((args, kwargs, out), levels=3))
            self.ops.append((str(func_packet).removeprefix("aten."), flops, moved))
        return result


def batch_of(cfg, kind, micro_batch, seq_len):
    if isinstance(cfg, ModuleTarget):   # a module: its batch_fn's batches, else the tokens its config takes
        if cfg.batch_fn is not None:
            return cfg.batch(micro_batch, seq_len)
        cfg, kind = cfg.config, cfg.inner_kind
    vocab = cfg.vocab_size
    x = torch.randint(0, vocab, (micro_batch, seq_len))
    return x, (torch.randint(0, vocab, (micro_batch, seq_len)) if kind == "gpt" else x)


def fake_step(model, kind, cfg, setting, micro_batch) -> dict:
    """One fake step of ``model`` under ``setting``; `FakeStepError` (a ValueError) saying why
    when a fake tensor cannot take it (a value read, a value-dependent shape)."""
    ck = model.adapter if kind == "module" else None   # a module's blocks: checkpointed here
    if ck is not None and setting["checkpointing"] and not ck.can_checkpoint:
        raise ValueError(f"checkpointing needs the blocks to recompute: tunekit.plan(..., blocks='layers') "
                         f"(an attribute path of {type(model.model).__name__} or a list of its modules)")
    try:
        if ck is not None:
            ck.set_checkpointing(setting["checkpointing"])
        step = _fake_step_of(model, kind, cfg, setting, micro_batch)
    except Exception as e:
        reason = fake_failure(e)
        if reason is None:
            raise
        raise FakeStepError(reason) from e
    finally:
        if ck is not None and ck.checkpointing:
            ck.set_checkpointing(False)
    if ck is not None:   # measure_memory's adapter does not know the blocks checkpointed here
        step["notes"] = [n for n in step["notes"] if not n.startswith("checkpointing requested")]
    return step


def _fake_step_of(model, kind, cfg, setting, micro_batch) -> dict:
    batch = batch_of(cfg, kind, micro_batch, setting["seq_len"])
    report = measure_memory(model, batch, optimizer=setting["optimizer"], precision=setting["precision"],
                            checkpointing=setting["checkpointing"], estimate=False)
    components = {k: float(report.measured.get(k, 0.0)) for k in COMPONENTS}
    if any(math.isnan(v) for v in components.values()):
        raise ValueError(f"the fake step left a component unmeasured: {components}")
    adapter = adapt(model)
    ac = autocast_dtype(setting["precision"])
    before = adapter.checkpointing
    counter = RooflineCounter()
    try:
        if adapter.can_checkpoint:
            adapter.set_checkpointing(setting["checkpointing"])
        with counter:
            with torch.autocast("cpu", dtype=ac) if ac is not None else contextlib.nullcontext():
                loss = loss_of(model, kind, batch)
            loss.backward()
    finally:
        if adapter.can_checkpoint:
            adapter.set_checkpointing(before)
        for p in model.parameters():
            p.grad = None
    count = counter.result()
    ops = counter.ops
    tokens = micro_batch * setting["seq_len"]
    # the Lab's MFU convention where the shape is known (causal attention halved, no recompute)
    model_flops = adapter.model_flops(setting["seq_len"], tokens, float(count.model))[0]

    def per_op(peak, bw):
        out = {}
        for name, flops, moved in ops:
            t = max(flops / (peak * 1e12) if peak else 0.0, moved / (bw * 1e12) if bw else 0.0)
            out[name] = out.get(name, 0.0) + t
        return out

    def bound_s(peak, bw):
        return sum(per_op(peak, bw).values()) if (peak or bw) else math.nan

    def top(peak, bw):
        return sorted([kv for kv in per_op(peak, bw).items() if kv[1] > 0], key=lambda kv: -kv[1])[:6] \
            if (peak or bw) else []

    notes = [n for n in report.notes if "no CUDA device" not in n and "fresh AdamW" not in n]
    notes += count.notes
    return dict(components=components, executed=float(count.executed), model=float(model_flops),
                bound_s=bound_s, top=top, notes=notes)


def loss_of(model, kind, batch):
    if kind == "module":   # plan.module.Stepped: the user's loss on its twin
        return model(*batch)
    x, y = batch
    if kind == "gpt":
        return model(x, y)[1]
    return model(input_ids=x, labels=y, use_cache=False).loss


def search_micro_batch(model, kind, cfg, setting, dev, limit) -> int | None:
    """The largest micro-batch whose fake step fits the device: doubling, then bisection."""
    def fits(mb):
        step = fake_step(model, kind, cfg, dict(setting, micro_batch=mb), mb)
        return sum(step["components"].values()) + sum(b for b, _ in dev["fixed"].values()) <= dev["memory"]

    if not fits(1):
        return 0
    lo, hi = 1, 2
    while hi <= limit and fits(hi):
        lo, hi = hi, hi * 2
    hi = min(hi, limit + 1)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo
