"""One rank of a distributed run: ``python -m tunekit.parallel.worker SPEC.json`` under torchrun (or
the elastic agent ``tunekit.parallel.launch`` starts), or ``join(spec)`` from such a process. Engine.

Every rank builds the same model from the spec with the same seed, draws the same global batch
(``micro_batch x world_size`` samples per micro-step, what one process would see) and trains on
its slice of it, under the Lab's toggles: precision (FSDP2's MixedPrecisionPolicy for the
sharded kinds, autocast for DDP), per-block checkpointing, the registry's optimizers,
attention, micro_batch and grad_accum (gradient sync only on the last micro-step).

    ddp           DistributedDataParallel
    fsdp          fully_shard(block, reshard_after_forward=True) per block + root, 1-D mesh
    fsdp_grad_op  the same with reshard_after_forward=False (SHARD_GRAD_OP)
    None          one process, the model as it is (a cluster job of one device)
    hsdp          2-D mesh (nodes, nproc) = ("replicate", "shard"): shard within a node,
                  replicate across nodes

Rank 0 gathers every rank's figures and returns one RunResult (``aggregate``; written as JSON to
``spec["out_dir"]/result.json`` when given); other ranks return None. The spec is a dict:
``model`` (see tunekit.models.spec), ``parallel``, ``toggles`` (Toggles fields), ``steps``,
``warmup``, ``seed``, ``data``; optional ``nproc`` (ranks per node; default LOCAL_WORLD_SIZE),
``nodes``, ``weights`` (a state_dict file to start from), ``comm`` (count the collectives of one
untimed step, default True), ``peak_tflops``/``peak_tflops_source``/``peak_kind`` (the peak MFU is
measured against; default this machine's), ``launched_at`` (time.time() at launch),
``progress_file``, ``gloo_ifname``, ``timeout_s``. The step itself is ``train.TrainStep``,
the one the Lab takes, and the record ``train.record.run_result``, the one the Lab builds.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from tunekit.core import registry
from tunekit.core.comm import expected_comm, layout_problems
from tunekit.core.notes import encoded
from tunekit.core.registry import FP16
from tunekit.core.results import RunResult
from tunekit.core.setting import Setting
from tunekit.core.toggles import Env, Toggles, normalized, problems
from tunekit.measure.comm import CommCounter
from tunekit.measure.conditions import ConditionsMeter, rank_reading
from tunekit.measure.device import torch_dtype
from tunekit.measure.device_meter import DeviceMeter
from tunekit.measure.timing import time_repeats
from tunekit.models.adapters import adapt
from tunekit.models.optimizers import unavailable_optimizers
from tunekit.models.spec import build_model
from tunekit.models.units import fsdp_units
from tunekit.parallel.aggregate import aggregate
from tunekit.train.step import TrainStep, local_bytes, token_batcher


class Rank:
    """One rank's training step (train.TrainStep) on its slice of the global batch, its
    model wrapped for ``spec["parallel"]``.

    ``step()`` takes one optimizer step and returns this rank's loss (a tensor);
    ``expected_comm()`` what tunekit.core.comm predicts for one step."""

    def __init__(self, spec: dict, rank: int, world: int, nproc: int, device: torch.device):
        self.spec, self.rank, self.world, self.nproc, self.device = spec, rank, world, nproc, device
        self.nodes = world // nproc
        # the spec's toggles and layout, read once into the Setting every rank steps under
        self.t = t = normalized(Setting(parallel=spec["parallel"], world_size=world, nodes=self.nodes)
                                .replace(**spec.get("toggles", {})))
        self.parallel = t.parallel
        model = build_model(spec["model"], spec.get("seed", 0))
        if spec.get("weights"):
            model.load_state_dict(torch.load(spec["weights"], map_location="cpu", weights_only=True))
        self.model = model.to(device).train()
        self.model_name = type(model).__name__  # before fully_shard renames the class (FSDPGPT)
        self.adapter = adapt(self.model, spec.get("blocks"))
        if t.seq_len is None:
            self.t = t = t.replace(seq_len=self.adapter.default_seq_len(device.type))
        self.batcher = token_batcher(self.adapter, spec.get("data", "corpus"), device, spec.get("seed", 0))
        # the sharded kinds cast through their MixedPrecisionPolicy, DDP under autocast
        self.trainer = TrainStep(self.model, self.adapter, device, self._batch, self.adapter.loss,
                                 cast=self.parallel in ("ddp", None))
        self.trainer.apply_model(t)
        self.n_params = sum(p.numel() for p in self.model.parameters())
        self.units = fsdp_units(self.model, self.adapter, self.parallel)
        self.buffer_bytes = sum(b.numel() * b.element_size() for b in self.model.buffers())
        self.probe = None
        if rank == 0 and spec.get("count_flops", True):  # one untimed count, before sharding
            # its own batches: the training batcher must draw the same on every rank
            batch = token_batcher(self.adapter, self.batcher.source, device, spec.get("seed", 0) + 1)
            self.probe, _ = self.trainer.probe(t, batch.get(t.micro_batch, t.seq_len))
        self.trainer.forward = self._wrap()
        self.trainer.sync = self._sync
        self.trainer.apply_optimizer(t)  # on the sharded parameters

    # --- sharding ---------------------------------------------------------------------------

    def _mixed_precision(self):
        from torch.distributed.fsdp import MixedPrecisionPolicy

        half = self.t.autocast
        if half is None:
            return MixedPrecisionPolicy()
        return MixedPrecisionPolicy(param_dtype=torch_dtype(half), reduce_dtype=torch_dtype(self.t.grads))

    def _wrap(self):
        if self.parallel is None:    # one process (a cluster job of one GPU): the model as it is
            return self.model
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

    def _batch(self, micro_batch: int, seq_len: int):
        """This rank's slice of the global batch (every rank draws the same one)."""
        x, y = self.batcher.get(micro_batch * self.world, seq_len)
        mine = slice(self.rank * micro_batch, (self.rank + 1) * micro_batch)
        return x[mine], y[mine]

    def _sync(self, last: bool):
        """The gradients are reduced on the last micro-step only."""
        if self.parallel is None:
            return contextlib.nullcontext()
        if self.parallel == "ddp":
            return contextlib.nullcontext() if last else self.trainer.forward.no_sync()
        self.model.set_requires_gradient_sync(last)
        return contextlib.nullcontext()

    def step(self):
        """One optimizer step of this rank under the run's toggles: its loss (a tensor)."""
        return self.trainer.step(self.t)

    def expected_comm(self) -> dict:
        """What tunekit.core.comm predicts one step sends (the sharded kinds gather half weights)."""
        if self.parallel is None:
            return {}
        half = self.t.autocast if self.parallel != "ddp" else None
        param_bytes = registry.dtype(half or self.t.compute_on(self.device.type)).bytes
        return expected_comm(self.parallel, self.units, self.world, self.nodes, param_bytes,
                             registry.dtype(self.t.grads).bytes,
                             self.buffer_bytes, self.t.grad_accum)

    def local_bytes(self) -> dict:
        """Bytes of parameters, gradients and optimizer state this rank holds (its shards)."""
        opt = self.trainer.optimizer
        return {"params_bytes": local_bytes(self.model.parameters()), "grads_bytes": self.trainer.grads_bytes,
                "optimizer_bytes": local_bytes(v for s in opt.state.values() for v in s.values()
                                               if isinstance(v, torch.Tensor))}


# --- the run ------------------------------------------------------------------------------


def _env_int(name: str, default=None) -> int:
    v = os.environ.get(name)
    if v is None:
        if default is None:
            raise RuntimeError(f"{name} is not set: run under torchrun (or tunekit.parallel.launch)")
        return default
    return int(v)


def check_spec(spec: dict) -> list[str]:
    """Why ``spec`` cannot run (empty: it can). Sizes are checked again against the job."""
    out = []
    if not isinstance(spec, dict):
        return [f"a spec is a dict, got {type(spec).__name__}"]
    if spec.get("parallel") is not None or spec.get("nproc", 1) * spec.get("nodes", 1) != 1:
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
    if t.precision == FP16 and spec.get("parallel") != "ddp":
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
        return lambda done, total, seconds=None: None

    def report(done, total, seconds=None):   # "done total [seconds of that step]" per line
        with open(path, "a") as f:
            f.write(f"{done} {total}\n" if seconds is None else f"{done} {total} {seconds:.9f}\n")
    return report


def _run(spec, rank, world, nproc, device) -> RunResult | None:
    trainer = Rank(spec, rank, world, nproc, device)
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

    def after(i, s):
        progress(i + 1, steps, s)

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
            "conditions": reading, "where": _where(), **trainer.local_bytes()}
    gathered = [None] * world
    dist.all_gather_object(gathered, mine)
    if rank != 0:
        return None
    result = aggregate(spec, trainer, gathered, (curve / world).tolist(), warmup, first_step_at,
                       meter.source, device)
    if spec.get("out_dir"):
        out = Path(spec["out_dir"]) / "result.json"
        ranks = [{"rank": i, **g["where"]} for i, g in enumerate(gathered)]   # read by SlurmJob (job["ranks"])
        out.write_text(json.dumps({**encoded(result.to_dict()), "ranks": ranks}))   # notes keep their kinds
    return result


# --- a rank srun started (tunekit.parallel.slurm) ---------------------------------------------


def from_slurm_env() -> None:
    """Under srun: the rank variables torch.distributed reads, from Slurm's (nothing set twice)."""
    if "SLURM_PROCID" not in os.environ or "RANK" in os.environ:
        return
    os.environ["RANK"] = os.environ["SLURM_PROCID"]
    os.environ["WORLD_SIZE"] = os.environ["SLURM_NTASKS"]
    os.environ["LOCAL_RANK"] = os.environ.get("SLURM_LOCALID", "0")
    per_node = re.match(r"\d+", os.environ.get("SLURM_NTASKS_PER_NODE", "")
                        or os.environ.get("SLURM_TASKS_PER_NODE", ""))
    if per_node:
        os.environ["LOCAL_WORLD_SIZE"] = per_node.group(0)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(20000 + int(os.environ.get("SLURM_JOB_ID", "0")) % 20000))


def _where() -> dict:
    """This rank's node and the CPUs it may run on (its affinity: what srun's --cpu-bind left it)."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except AttributeError:    # no affinity call on this system (macOS)
        cpus = None
    return {"node": os.environ.get("SLURMD_NODENAME", socket.gethostname()), "cpus": cpus}


def write_rank_error(folder, rank: int, traceback: str) -> None:
    """A rank's traceback with its node, for the job's owner (read by SlurmJob's cause)."""
    Path(folder, f"error-rank{rank}.json").write_text(json.dumps(
        {"rank": rank, "node": os.environ.get("SLURMD_NODENAME", socket.gethostname()),
         "traceback": traceback, "at": time.time()}))


def main(argv=None) -> int:
    from torch.distributed.elastic.multiprocessing.errors import record

    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m tunekit.parallel.worker SPEC.json", file=sys.stderr)
        return 2
    spec = json.loads(Path(argv[0]).read_text())
    if "SLURM_PROCID" not in os.environ:
        record(join)(spec)
        return 0
    from_slurm_env()    # a rank srun started: its rank from Slurm's variables, its error to the job's folder
    try:
        join(spec)
    except BaseException:
        import traceback

        if spec.get("error_dir"):
            write_rank_error(spec["error_dir"], int(os.environ["RANK"]), traceback.format_exc())
        raise
    return 0


if __name__ == "__main__":
    code = main()
    if "SLURM_PROCID" in os.environ:
        # a rank srun started, its work done and its group destroyed: leave without C++'s static
        # destructors, where a gloo thread still joinable aborts the process ("terminate called without
        # an active exception": one run in three with a rank bound to one core) and srun says it failed
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)
