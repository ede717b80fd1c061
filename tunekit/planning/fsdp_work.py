"""FSDP's own memory-bound work in each micro-step of a sharded plan, as op records (core.expected prices
them at the device's streaming bandwidth; each appears in ``Plan.expected.by_op`` under its name). Pure.

What a rank copies, casts, divides and adds besides its model's ops, per fully_shard unit, as the FSDP of a
named torch version does it (`FSDP_VERSIONS`):

- ``fsdp2`` (tunekit's ranks: ``fully_shard`` with ``MixedPrecisionPolicy(param_dtype=the compute dtype,
  reduce_dtype=the weights' dtype)``; torch 2.13.0 torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py).
  Each all-gather (the forward's, and FULL_SHARD's backward re-gather): ``_get_param_all_gather_inputs``
  casts the shard to the param dtype (``_foreach_copy_`` into a flat tensor) where it differs from the
  weights', ``all_gather_copy_in`` copies that into the rank's slice of the gather buffer, and
  ``foreach_all_gather_copy_out`` copies the gathered buffer into each parameter's unsharded tensor
  (``split_with_sizes_copy``). Each backward: ``foreach_reduce_scatter_copy_in`` chunk-cats the unsharded
  gradients into the reduce dtype's flat buffer (a cast where they differ); ``_get_gradient_divide_factors``
  divides only for fp16 (fp32 and bf16 reduce by NCCL's AVG: no kernel), a pre-divide of the buffer and a
  post-divide of the shard by the factors it finds; the reduced shard is cast to the weights' dtype where
  they differ (``_to_dtype_if_needed``) and added to the sharded gradient where one exists: every
  micro-step after the first under ``grad_accum`` (``+=``; FSDP2 reduce-scatters every micro-batch unless
  ``set_requires_gradient_sync(False)``).
  The compute runs on the param dtype (no autocast): the plan counts the half model's step
  (planning.step.in_param_dtype), so no autocast weight cast is counted beside these.
- ``fsdp1`` (FlatParameter FSDP, ``MixedPrecision(param_dtype, reduce_dtype)``; torch 2.13.0
  torch/distributed/fsdp/_runtime_utils.py ``_post_backward_hook``, ``_reduce_grad``,
  ``_get_reduce_scatter_tensors``, ``_accumulate_sharded_grad``, ``_cast_grad_to_param_dtype``, and
  _flat_param.py ``_get_unflat_views_unaligned``; the same functions as the 1.13-2.1 releases the published
  FSDP1 runs used, whose files at those tags were not read): a half param dtype casts the shard
  (``_mp_shard.copy_``) before each all-gather, whose output is the flat parameter the module's parameters
  are views of (no copy-out); in backward those views' gradients are concatenated into the flat gradient
  (``torch.split``'s backward), which is cast to the reduce dtype where it differs, padded to a multiple of
  the ranks (``F.pad``, where it is not one), pre-divided and its shard post-divided by
  ``_get_gradient_predivide_factor`` (whatever the dtype: ``_div_if_needed``), the shard cast to the
  weights' dtype and added to ``_saved_grad_shard`` where one exists (every micro-step after the first:
  without ``no_sync``, Composer's default, every micro-batch reduce-scatters).
  ``fsdp1`` gathers in the compute dtype (``MixedPrecision(param_dtype=reduce_dtype=the compute dtype)``:
  Composer's mixed_precision PURE) and computes on it, the half model's step; ``fsdp1_autocast`` gathers
  the fp32 weights and reduces in the compute dtype under autocast (Composer's DEFAULT): the plan's
  autocast step, its weight casts counted.

    >>> recs = fsdp_records("fsdp2", [[(4, 3)]], shard=2, passes=2, weights="fp32", param="bf16", reduce="fp32")
    >>> [(r[2], r[4]) for r in recs][:3]   # a shard of 2 x 3 = 6 elements cast, 6 x (4 + 2); copied, 6 x 2 x 2; ...
    [('forward', 36), ('forward', 24), ('forward', 48)]
"""
from __future__ import annotations

from tunekit.core import registry
from tunekit.core.comm import numel, unit_gathered_numel

FSDP2, FSDP1, FSDP1_AUTOCAST = "fsdp2", "fsdp1", "fsdp1_autocast"
_FSDP1 = ("torch 2.13.0 torch/distributed/fsdp/_runtime_utils.py (_post_backward_hook, _reduce_grad, "
          "_accumulate_sharded_grad) and _flat_param.py (_get_unflat_views_unaligned)")
FSDP_VERSIONS = {
    FSDP2: "torch 2.13.0 torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py (foreach_all_gather, "
           "foreach_all_gather_copy_out, foreach_reduce)",
    FSDP1: _FSDP1 + ", MixedPrecision(param_dtype and reduce_dtype the compute dtype)",
    FSDP1_AUTOCAST: _FSDP1 + ", MixedPrecision(reduce_dtype the compute dtype) on fp32 weights under autocast",
}


def predivide_factor(world: int) -> int:
    """FSDP's gradient pre-divide factor over ``world`` ranks (the post-divide is world / it): the
    largest power of two dividing ``world`` below its square root, doubled while it stays at most so
    (torch 2.13.0 torch/distributed/algorithms/_comm_hooks/default_hooks.py,
    ``DefaultState._get_gradient_predivide_factor``). 8 ranks: 4 (then 2); 64: 8 (then 8)."""
    factor = 1
    while world % factor == 0 and world / factor > factor:
        factor *= 2
    return factor


def fsdp_records(version: str, units, shard: int, passes: int, weights: str, param: str, reduce: str,
                 grad_accum: int = 1) -> list:
    """One micro-step's FSDP op records (core.expected's ``(name, "memory", phase, 0, bytes, None,
    itemsize)``), one per unit and kernel. ``units``: each fully_shard unit's parameter shapes;
    ``shard``: ranks a parameter is split over; ``passes``: all-gathers per unit and micro-step (2
    FULL_SHARD, 1 SHARD_GRAD_OP); ``weights``, ``param``, ``reduce``: the dtypes (registry names) of
    the sharded weights, the gathered parameters (their unsharded gradients too) and the reduction.
    The accumulation into the sharded gradient is the mean micro-step's: (grad_accum - 1) / grad_accum
    of one read-add-write."""
    if version not in FSDP_VERSIONS:
        raise ValueError(f"fsdp must be one of {tuple(FSDP_VERSIONS)}, got {version!r}")
    w, p, r = (registry.dtype(d).bytes for d in (weights, param, reduce))
    later = (grad_accum - 1) / grad_accum
    prefix = FSDP1 if version != FSDP2 else FSDP2
    out = []

    def add(name, phase, nbytes, itemsize, times=1):
        if nbytes > 0:
            out.extend([(f"{prefix}: {name}", "memory", phase, 0, nbytes, None, itemsize)] * times)

    for unit in (u for u in units if len(u)):
        if version == FSDP2:
            full = unit_gathered_numel(unit, shard)   # each parameter padded on dim 0
            mine = full // shard
            for phase, times in (("forward", 1), ("backward", passes - 1)):
                add(f"all-gather copy-in (cast to {param})", phase, mine * (w + p) * (p != w), w, times)
                add("all-gather copy-in (into the gather buffer)", phase, mine * 2 * p, p, times)
                add("all-gather copy-out (split into parameters)", phase, full * 2 * p, p, times)
            add(f"reduce-scatter copy-in (chunk-cat{f', cast to {reduce}' if r != p else ''})", "backward",
                full * (p + r), p)
            pre = predivide_factor(shard) if reduce == registry.FP16 else 1
            add("gradient pre-divide", "backward", full * 2 * r * (pre > 1), r)
            add("gradient post-divide", "backward", mine * 2 * r * (shard // pre > 1 and reduce == registry.FP16), r)
        else:
            flat = sum(numel(s) for s in unit)
            full = -(-flat // shard) * shard          # the flat parameter padded to the ranks
            mine = full // shard
            for phase, times in (("forward", 1), ("backward", passes - 1)):
                add(f"all-gather copy-in (cast to {param})", phase, mine * (w + p) * (p != w), w, times)
            add("flat gradient (cat of the parameters' gradients)", "backward", flat * 2 * p, p)
            add(f"gradient cast to {reduce}", "backward", flat * (p + r) * (p != r), p)
            add("reduce-scatter input padding (F.pad)", "backward", (flat + full) * r * (full > flat), r)
            pre = predivide_factor(shard)
            add("gradient pre-divide", "backward", full * 2 * r * (pre > 1), r)
            add("gradient post-divide", "backward", mine * 2 * r * (shard // pre > 1), r)
        add(f"reduced gradient cast to {weights}", "backward", mine * (r + w) * (r != w), r)
        add("sharded gradient accumulation (+=)", "backward", mine * 3 * w * later, w)
    return out
