"""One rank of a distributed run: ``python -m tunekit.engine.dist.worker SPEC.json`` under torchrun (or
the elastic agent ``tunekit.engine.dist.launch`` starts), or ``join(spec)`` from such a process. Engine.

Every rank builds the same model from the spec with the same seed, draws the same global batch
(``micro_batch x world_size`` samples per micro-step, what one process would see) and trains on
its slice of it, under the Lab's toggles: precision (FSDP2's MixedPrecisionPolicy for the
sharded kinds, autocast for DDP), per-block checkpointing, the registry's optimizers,
attention, micro_batch and grad_accum (gradient sync only on the last micro-step).

    ddp           DistributedDataParallel
    fsdp          fully_shard(block, reshard_after_forward=True) per block + root, 1-D mesh
    fsdp_grad_op  the same with reshard_after_forward=False (SHARD_GRAD_OP)
    hsdp          2-D mesh (nodes, nproc) = ("replicate", "shard"): shard within a node,
                  replicate across nodes

Rank 0 gathers every rank's figures and returns one RunResult (written as JSON to
``spec["out_dir"]/result.json`` when given); other ranks return None. The spec is a dict:
``model`` (see tunekit.models.spec), ``parallel``, ``toggles`` (Toggles fields), ``steps``,
``warmup``, ``seed``, ``data``; optional ``nproc`` (ranks per node; default LOCAL_WORLD_SIZE),
``nodes``, ``weights`` (a state_dict file to start from), ``comm`` (count the collectives of one
untimed step, default True), ``peak_tflops``/``peak_source``, ``launched_at`` (time.time() at launch),
``progress_file``, ``gloo_ifname``, ``timeout_s``.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from ...core import formulas, registry
from ...core.bounds import above_peak
from ...core.comm import expected_comm, layout_problems, total_by
from ...core.conditions import combine
from ...models.optimizers import build_optimizer, unavailable_optimizers
from ..precision import autocast, matmul_precision
from ...core.results import RunResult
from ...measure.step import probe_step
from ...core.toggles import Env, Toggles, autocast_dtype, compute_dtype, label, normalized, problems
from ...measure.comm import CommCounter
from ...measure.device import device_label
from ...measure.meters import DeviceMeter
from ...measure.conditions import ConditionsMeter, judge_rank, rank_reading
from ...measure.timing import time_repeats
from ...models.adapters import adapt
from ...models.data import Batcher
from ...models.spec import build_model

NO_WAIT = ("not measured: the collectives run asynchronously on the backend's own threads and "
           "torch exposes no per-collective wait time without a profiler trace")


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def _nbytes(tensors) -> int:
    return sum(_local(t).numel() * _local(t).element_size() for t in tensors if t is not None)


def _opt_bytes(opt) -> int:
    return _nbytes(v for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor))


class Trainer:
    """The model, data and optimizer of one rank, wrapped for ``spec["parallel"]``.

    ``step()`` takes one optimizer step and returns this rank's loss (a tensor);
    ``expected_comm()`` what tunekit.core.comm predicts for one step."""

    def __init__(self, spec: dict, rank: int, world: int, nproc: int, device: torch.device):
        self.spec, self.rank, self.world, self.nproc, self.device = spec, rank, world, nproc, device
        self.nodes = world // nproc
        self.parallel = spec["parallel"]
        self.t = normalized(Toggles().replace(**spec.get("toggles", {})))
        model = build_model(spec["model"], spec.get("seed", 0))
        if spec.get("weights"):
            model.load_state_dict(torch.load(spec["weights"], map_location="cpu", weights_only=True))
        self.model = model.to(device).train()
        self.model_name = type(model).__name__  # before fully_shard renames the class (FSDPGPT)
        self.adapter = adapt(self.model, spec.get("blocks"))
        t = self.t
        if t.seq_len is None:
            self.t = t = t.replace(seq_len=self.adapter.default_seq_len(device.type))
        if t.attention is not None and self.adapter.attentions and t.attention != self.adapter.attention:
            self.adapter.set_attention(t.attention)
        if self.adapter.can_checkpoint and t.checkpointing != self.adapter.checkpointing:
            self.adapter.set_checkpointing(t.checkpointing)
        self.n_params = sum(p.numel() for p in self.model.parameters())
        self.units = self._unit_shapes()
        self.buffer_bytes = sum(b.numel() * b.element_size() for b in self.model.buffers())
        vocab = self.adapter.vocab_size or 256
        data = spec.get("data", "corpus")
        self.batcher = Batcher("synthetic" if vocab < 256 and data == "corpus" else data,
                               device=device, seed=spec.get("seed", 0), vocab_size=vocab)
        self.probe = None
        if rank == 0 and spec.get("count_flops", True):  # one untimed count, before sharding
            # its own batches: the training batcher must draw the same on every rank
            x, y = Batcher(self.batcher.source, device=device, seed=spec.get("seed", 0) + 1,
                           vocab_size=vocab).get(t.micro_batch, t.seq_len)
            with matmul_precision(t, device):
                self.probe = probe_step(self.model, lambda a, b: self.adapter.loss(self.model, a, b),
                                        x, y, lambda: autocast(t, device))
        self.fwd = self._wrap()
        self.optimizer = build_optimizer(t.optimizer, self.model.parameters(), t.lr)
        self.grads_bytes = None

    # --- sharding ---------------------------------------------------------------------------

    def _unit_shapes(self) -> list:
        """Parameter shapes per fully_shard unit (each block, then the root's own); for DDP one
        unit with every parameter. A tied weight counts once, in the first unit holding it."""
        seen, units = set(), []
        groups = [list(b.parameters()) for b in self.adapter.blocks()] if self.parallel != "ddp" else []
        for params in groups + [list(self.model.parameters())]:
            unit = []
            for p in params:
                if id(p) not in seen and p.requires_grad:
                    seen.add(id(p))
                    unit.append(tuple(p.shape))
            units.append(unit)
        return units

    def _mixed_precision(self):
        from torch.distributed.fsdp import MixedPrecisionPolicy

        half = autocast_dtype(self.t)
        if half is None:
            return MixedPrecisionPolicy()
        return MixedPrecisionPolicy(param_dtype=getattr(torch, registry.dtype(half).torch_name),
                                    reduce_dtype=torch.float32)

    def _wrap(self):
        if self.parallel == "ddp":
            from torch.nn.parallel import DistributedDataParallel as DDP

            ids = [self.device.index] if self.device.type == "cuda" else None
            return DDP(self.model, device_ids=ids)
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        if self.parallel == "hsdp":
            mesh = init_device_mesh(self.device.type, (self.nodes, self.nproc),
                                    mesh_dim_names=("replicate", "shard"))
        else:
            mesh = init_device_mesh(self.device.type, (self.world,))
        reshard = self.parallel != "fsdp_grad_op"
        mp = self._mixed_precision()
        for block in self.adapter.blocks():
            fully_shard(block, mesh=mesh, reshard_after_forward=reshard, mp_policy=mp)
        fully_shard(self.model, mesh=mesh, reshard_after_forward=reshard, mp_policy=mp)
        return self.model

    # --- one step ---------------------------------------------------------------------------

    def _slice(self, x, y):
        mb = self.t.micro_batch
        return x[self.rank * mb:(self.rank + 1) * mb], y[self.rank * mb:(self.rank + 1) * mb]

    def _sync(self, last: bool):
        if self.parallel == "ddp":
            return contextlib.nullcontext() if last else self.fwd.no_sync()
        self.model.set_requires_gradient_sync(last)
        return contextlib.nullcontext()

    def step(self):
        t, total = self.t, None
        ddp_autocast = self.parallel == "ddp"  # the sharded kinds cast through their policy
        with matmul_precision(t, self.device):
            for i in range(t.grad_accum):
                x, y = self._slice(*self.batcher.get(t.micro_batch * self.world, t.seq_len))
                with self._sync(i == t.grad_accum - 1):
                    with autocast(t, self.device) if ddp_autocast else contextlib.nullcontext():
                        loss = self.adapter.loss(self.fwd, x, y)
                    if t.grad_accum > 1:
                        loss = loss / t.grad_accum
                    loss.backward()
                total = loss.detach() if total is None else total + loss.detach()
            if self.grads_bytes is None:  # once, at the first step: the local gradients
                self.grads_bytes = _nbytes(p.grad for p in self.model.parameters())
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return total

    def expected_comm(self) -> dict:
        half = autocast_dtype(self.t) if self.parallel != "ddp" else None
        param_bytes = registry.dtype(half).bytes if half else 4
        return expected_comm(self.parallel, self.units, self.world, self.nodes, param_bytes, 4,
                             self.buffer_bytes, self.t.grad_accum)

    def local_bytes(self) -> dict:
        params = list(self.model.parameters())
        return {"params_bytes": _nbytes(params), "grads_bytes": self.grads_bytes,
                "optimizer_bytes": _opt_bytes(self.optimizer)}


# --- the run ------------------------------------------------------------------------------


def _env_int(name: str, default=None) -> int:
    v = os.environ.get(name)
    if v is None:
        if default is None:
            raise RuntimeError(f"{name} is not set: run under torchrun (or tunekit.engine.dist.launch)")
        return default
    return int(v)


def check_spec(spec: dict) -> list[str]:
    """Why ``spec`` cannot run (empty: it can). Sizes are checked again against the job."""
    out = []
    if not isinstance(spec, dict):
        return [f"a spec is a dict, got {type(spec).__name__}"]
    out += layout_problems(spec.get("parallel"), spec.get("nproc", 1), spec.get("nodes", 1))
    for name, low in (("steps", 1), ("warmup", 0)):
        v = spec.get(name, low)
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            out.append(f"{name} must be a whole number >= {low}, got {v!r}")
    if "model" not in spec:
        out.append("the spec needs a model (see tunekit.models.spec)")
    try:
        t = Toggles().replace(**spec.get("toggles", {}))
    except TypeError as e:
        return out + [str(e)]
    dev = "cuda" if torch.cuda.is_available() and spec.get("device", "auto") != "cpu" else "cpu"
    out += problems(t, Env(device_type=dev, unavailable_optimizers=unavailable_optimizers(dev)))
    if t.compile:
        out.append("compile is not applied by distributed runs (the ranks run eagerly): leave it off")
    if t.precision == "fp16" and spec.get("parallel") != "ddp":
        out.append("fp16 with FSDP needs a sharded gradient scaler tunekit does not drive: use bf16 "
                   "(FSDP2's MixedPrecisionPolicy) or parallel='ddp'")
    return out


def join(spec: dict) -> RunResult | None:
    """Run this process's rank of the job (env RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR...).
    Returns the aggregated RunResult on global rank 0, None elsewhere."""
    errors = check_spec(spec)
    if errors:
        raise ValueError("; ".join(errors))
    rank, world = _env_int("RANK"), _env_int("WORLD_SIZE")
    local_rank = _env_int("LOCAL_RANK", 0)
    local_world = _env_int("LOCAL_WORLD_SIZE", world)
    nproc = spec.get("nproc") or local_world
    nodes = world // nproc
    if world != nproc * spec.get("nodes", nodes):
        raise ValueError(f"the job has {world} ranks, the spec asks for {spec.get('nodes', nodes)} "
                         f"nodes x {nproc} ranks")
    if spec.get("gloo_ifname"):
        os.environ["GLOO_SOCKET_IFNAME"] = spec["gloo_ifname"]
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_world))
    cuda = torch.cuda.is_available() and spec.get("device", "auto") != "cpu"
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    timeout = timedelta(seconds=spec.get("timeout_s", 300))
    spec = {**spec, "_joined_at": time.time()}
    dist.init_process_group("nccl" if cuda else "gloo", timeout=timeout,
                            device_id=device if cuda else None)
    spec["_group_at"] = time.time()
    try:
        result = _run(spec, rank, world, nproc, device)
        dist.barrier()  # every rank tears down together (gloo has aborted in a lone teardown)
        return result
    finally:
        dist.destroy_process_group()


def _progress(spec, rank):
    path = spec.get("progress_file")
    if rank != 0 or not path:
        return lambda done, total: None

    def report(done, total):
        with open(path, "a") as f:
            f.write(f"{done} {total}\n")
    return report


def _run(spec, rank, world, nproc, device) -> RunResult | None:
    trainer = Trainer(spec, rank, world, nproc, device)
    steps, warmup = spec.get("steps", 10), spec.get("warmup", 1)
    progress = _progress(spec, rank)
    dist.barrier()
    first_step_at = time.time()
    counter = CommCounter(node_of=lambda r: r // nproc) if spec.get("comm", True) else None
    tables, counted = [], []

    def counted_step(i):
        # The counter sees every op of the step through a Python dispatch mode, which slows
        # the step (benchmarks/bench_dist.py) and may change how communication overlaps: the
        # collectives are counted on the last untimed warm-up step (every step of a run issues
        # the same ones), and the timed steps run without it.
        with counter:
            loss = trainer.step()
        tables.append(counter.table())
        counted.append(i)
        counter.reset()
        return loss

    warm = [counted_step(i + 1) if counter is not None and i == warmup - 1 else trainer.step()
            for i in range(warmup)]
    losses = []

    def step(i):
        if counter is not None and not tables:  # no warm-up: the first timed step, slowed
            losses.append(counted_step(warmup + i + 1))
        else:
            losses.append(trainer.step())

    def after(i, _s):
        progress(i + 1, steps)

    cuda_index = device.index if device.type == "cuda" else None
    meter = DeviceMeter(device, cuda_index).start()
    progress(0, steps)
    index = iter(range(steps))
    pids = [None] * world
    dist.all_gather_object(pids, os.getpid())  # a run's own ranks are not 'other processes' on a GPU
    conditions = ConditionsMeter(cuda_index).start()
    try:
        t0 = time.perf_counter()
        times = time_repeats(lambda: step(next(index)), device, warmup=0, repeats=steps,
                             after_each=after)
        reading = rank_reading(conditions, time.perf_counter() - t0, exclude_pids=pids)
    finally:
        peak = meter.stop()
    # the loss of the global batch: the mean of the ranks' slice means (outside the counter)
    curve = torch.stack([v.float() for v in warm + losses]).to(device)
    dist.all_reduce(curve)
    mine = {"times": times, "peak": peak, "comm": tables, "counted": counted, "other": counter.other if counter else {},
            "conditions": reading, **trainer.local_bytes()}
    gathered = [None] * world
    dist.all_gather_object(gathered, mine)
    if rank != 0:
        return None
    result = _aggregate(spec, trainer, gathered, (curve / world).tolist(), warmup, first_step_at,
                        meter.source, device)
    if spec.get("out_dir"):
        out = Path(spec["out_dir"]) / "result.json"
        out.write_text(json.dumps(result.to_dict()))
    return result


def _comm_record(trainer, gathered, notes, warmup) -> dict | None:
    tables = gathered[0]["comm"]
    if not tables:
        notes.append("communication not counted (comm=False)")
        return None
    mean = tables[0]
    step = gathered[0]["counted"][0]
    if step > warmup:
        notes.append("collectives counted on the first timed step (no warm-up): its time includes "
                     "the counter's cost")
    if trainer.parallel == "ddp" and step == 2:
        notes.append("comm counted DDP's second iteration, which also broadcasts its rebuilt bucket "
                     "order once (a few bytes); warm up 3 steps to count a steady one")
    agree = all(g["comm"] == tables for g in gathered)
    return {"per_step": mean, "by_kind": total_by(mean, "kind"), "by_scope": total_by(mean, "scope"),
            "expected": trainer.expected_comm(), "other_ops": gathered[0]["other"],
            "ranks_agree": agree, "rank": 0, "step_counted": step,
            "convention": "bytes: all_gather its gathered output, reduce_scatter its input, "
                          "all_reduce and broadcast their buffer; one optimizer step (step_counted, "
                          "1-based, warm-up included), on rank 0"}


def _aggregate(spec, trainer, gathered, losses, warmup, first_step_at, peak_source, device) -> RunResult:
    from ...measure.peaks import resolve_peak

    t, world = trainer.t, trainer.world
    steps = len(gathered[0]["times"])
    # a step ends when its slowest rank ends: the max over ranks of each step's time
    per_step = [max(g["times"][i] for g in gathered) for i in range(steps)]
    step_s = sum(per_step) / steps
    notes = [f"{spec['parallel']} over {trainer.nodes} node(s) x {trainer.nproc} rank(s); "
             f"global batch {t.micro_batch * world} x grad_accum {t.grad_accum}",
             f"comm_wait_s {NO_WAIT}"]
    probe = trainer.probe
    per_sample = t.seq_len
    tokens = t.micro_batch * t.grad_accum * per_sample * world
    executed = probe.flops.executed * t.grad_accum * world if probe and probe.flops.executed else None
    counted = probe.flops.model * t.grad_accum * world if executed else None
    model_flops, convention, why = trainer.adapter.model_flops(t.seq_len, tokens, counted)
    notes.extend(why)
    dtype = compute_dtype(t, device.type)
    peak = resolve_peak(device, dtype, given=spec.get("peak_tflops"))
    peak_tflops = peak.tflops
    source = spec.get("peak_source") or peak.source
    all_peak = None if peak_tflops is None else peak_tflops * world  # MFU and HFU per device
    peaks = [g["peak"] for g in gathered]
    launched = spec.get("launched_at")
    ac = autocast_dtype(t)
    comm = _comm_record(trainer, gathered, notes, warmup)
    notes.append("params/grads/optimizer bytes: the largest rank's local shards")
    if launched is None:
        notes.append("launch_s unknown: the job was started outside tunekit.engine.dist.launch")
    else:
        joined, group = spec.get("_joined_at", launched), spec.get("_group_at", launched)
        notes.append(f"launch to first step {first_step_at - launched:.1f} s: {joined - launched:.1f} s "
                     f"to start the ranks (interpreters, torch import), {group - joined:.1f} s rendezvous "
                     f"and process group, {first_step_at - group:.1f} s model, FLOP count and sharding")
    fields = dict(
        run_id=None, label=f"{spec['parallel']} {trainer.nodes}x{trainer.nproc} " + label(t, Toggles()), toggles=t,
        steps=steps, warmup=warmup, tokens_per_step=tokens, tokens_per_s=tokens / step_s,
        step_s=step_s, step_s_min=min(per_step), step_s_max=max(per_step),
        flops_per_step=executed, model_flops_per_step=model_flops,
        flops_source="counted" if executed else "none",
        tflops=formulas.tflops(executed, step_s),
        mfu=formulas.mfu(model_flops, step_s, all_peak), hfu=formulas.hfu(executed, step_s, all_peak),
        peak_tflops=peak_tflops, peak_tflops_source=source,
        peak_mem_bytes=None if None in peaks else max(peaks), peak_mem_source=peak_source,
        params_bytes=max(g["params_bytes"] for g in gathered),
        grads_bytes=max(g["grads_bytes"] for g in gathered),
        optimizer_bytes=max(g["optimizer_bytes"] for g in gathered),
        saved_bytes=probe.saved_bytes if probe else None,
        weight_cast_bytes=probe.cast_bytes if probe else None,
        loss=losses[-1], loss_first=losses[0], device=device_label(device.index if device.type == "cuda" else None),
        attention_ran=probe.attention_ran if probe else trainer.adapter.attention_ran,
        compute_dtype=dtype, autocast_dtype=registry.dtype(ac).torch_name if ac else None,
        model=trainer.model_name, n_params=trainer.n_params,
        time=time.strftime("%Y-%m-%dT%H:%M:%S"), notes=notes + (probe.notes if probe else []),
        mfu_convention=convention, world_size=world, parallel=spec["parallel"], nodes=trainer.nodes,
        peak_mem_bytes_per_rank=peaks, comm=comm, comm_wait_s=None,
        launch_s=None if launched is None else first_step_at - launched,
        losses=losses)
    fields["conditions"] = ranks_conditions([g["conditions"] for g in gathered])
    if not all(math.isfinite(v) for v in losses):
        fields.update(status="failed", error="a loss was not finite")
    fields["above_peak"] = above_peak(fields["mfu"], fields["hfu"], peak_tflops, source)  # the Lab re-checks
    return RunResult(**fields)


def ranks_conditions(readings: list):
    """One verdict over the ranks: each judged with the CPU time of all the run's ranks on its
    machine taken out of 'other processes' (the ranks' windows are the same timed steps)."""
    group = {}
    for r in readings:
        group[r["host"]] = group.get(r["host"], 0.0) + r["raw"]["own_cpu_s"]
    return combine([judge_rank(r, group[r["host"]]) for r in readings],
                   [f"rank {i}" for i in range(len(readings))])


def main(argv=None) -> int:
    from torch.distributed.elastic.multiprocessing.errors import record

    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m tunekit.engine.dist.worker SPEC.json", file=sys.stderr)
        return 2
    record(join)(json.loads(Path(argv[0]).read_text()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
