"""The training lab: one live model, its data and optimizer, trained under toggles you flip.

    >>> lab = Lab()                                   # cpu-tiny GPT on the stdlib corpus
    >>> base = lab.run(steps=20)
    >>> fast = lab.run(steps=20, precision="bf16", checkpointing=True)
    >>> lab.results()                                 # one row per run (also in runs_dir()/lab-<day>.jsonl)
    >>> lab.compare()                                 # plotly: tokens/s and peak memory per run

Timing: ``warmup`` steps run first and are not timed; each timed step is clocked with the device
synchronized (tunekit.measure.timing). FLOPs are counted once per configuration on a separate,
untimed forward+backward (``flops_source`` = ``counted`` then ``cached``). MFU uses the analytic
model FLOPs (6N + attention, causal), HFU the counted executed FLOPs (recomputation included).

The pieces other engine code builds on are public: ``apply(t)`` puts toggles on the live model,
``train_step(t)`` takes one optimizer step, ``recover()`` cleans up after a failed step.
"""

from __future__ import annotations

import itertools
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from statistics import median

import torch

from ..core import registry
from ..core.paths import runs_dir
from ..core.results import RunResult, results_frame
from ..core.runlog import RunLog
from ..core.toggles import (
    Env,
    ToggleError,
    Toggles,
    autocast_dtype,
    compute_dtype,
    label,
    normalized,
    notices,
    problems,
)
from ..core.validate import function, instance, is_whole, real, whole
from ..measure.conditions import ConditionsMeter
from ..measure.device import device_label, existing_device
from ..measure.energy import Energy, EnergyMeter
from ..measure.flops import counting_active
from ..measure.interrupts import deferred_interrupt
from ..measure.meters import DeviceMeter
from ..measure.oom import ADVICE, drop_frames, free_memory, is_oom
from ..measure.peaks import rates
from ..measure.step import ProbeResult, add_flash_flops, probe_step
from ..measure.timing import time_repeats
from ..models.adapters import adapt, dry_step
from ..models.data import Batcher
from ..models.gpt import GPT, GPTConfig
from ..models.optimizers import build_optimizer, state_bytes, unavailable_optimizers
from . import fit
from .guard import NonFiniteRunError, Snapshot, _check, _NonFinite, weights_finite
from .precision import autocast, matmul_precision

__all__ = ["Lab", "RunResult", "results_frame", "NonFiniteRunError"]

_LAB_IDS = itertools.count()


@dataclass
class Steps:
    """What the timed steps of one run measured."""

    times: list             # seconds per step, device synchronized
    losses: list            # loss tensors (read after the clock: .item() would sync mid-run)
    peak_mem_bytes: float | None
    peak_mem_source: str
    slowed: bool            # timed under an outer FLOP counter: no rates from this clock
    energy: Energy | None = None      # over the timed steps
    alloc: dict | None = None         # CUDA allocator retries / OOMs over the timed steps
    trace: object = None              # Breakdown of one extra traced step (run(trace=True))
    memory: object = None             # MemoryTimeline of it (run(memory=True))
    conditions: object = None         # core.conditions.Conditions over the timed steps


class Lab:
    """A live model + data + optimizer kept across runs; see the module docstring for an example.

    ``model``: None (a fresh ``GPT(config or preset)``), ``"package.module:function"`` (a
    factory called with no arguments; distributed runs rebuild the model with it), a
    transformers causal LM (e.g.
    ``AutoModelForCausalLM.from_config(cfg)``: batches, loss, checkpointing and attention work
    as for the built-in GPT), or any ``nn.Module`` with ``batch_fn(micro_batch, seq_len) -> (x, y)``,
    ``loss_fn(model, x, y) -> loss`` and, for checkpointing, ``blocks`` (an attribute path such
    as ``"layers"`` or a list of modules). Keyword ``defaults`` (e.g. ``micro_batch=16``) set the
    toggles every run starts from. Runs are appended to ``log_path`` (its earlier runs resumed),
    else to the day's log ``core.paths.runs_dir()/lab-YYYY-MM-DD.jsonl`` that Labs share.

    Every argument is checked here, before any training: a model class instead of an instance, a
    device this machine lacks, defaults no run could use, and, by one forward of two samples under
    no_grad (``batch_fn`` is called once for it; weights, buffers and RNG states are left as they
    were), a batch the loss cannot take or a loss that is not one number.
    """

    def __init__(self, model=None, batch_fn=None, loss_fn=None, *, preset: str = "cpu-tiny",
                 config: GPTConfig | None = None, data="corpus", device=None, log_path=None,
                 peak_tflops: float | None = None, seed: int = 0, blocks=None, **defaults):
        # every argument is checked before anything is built, moved or trained
        if model is not None and not isinstance(model, str):
            instance("model", model, torch.nn.Module,
                     "None, an nn.Module instance or a factory 'package.module:function'")
        for name, fn, takes in (("batch_fn", batch_fn, "(micro_batch, seq_len) -> (x, y)"),
                                ("loss_fn", loss_fn, "(model, x, y) -> loss")):
            if fn is not None:
                function(name, fn, takes)
        seed = whole("seed", seed, 0)
        peak_tflops = real("peak_tflops", peak_tflops) if peak_tflops is not None else None
        self.device = existing_device(device) if device is not None else torch.device(
            "cuda" if torch.cuda.is_available() else "cpu")
        self.factory = model if isinstance(model, str) else None  # "package.module:function"
        if self.factory is not None:
            from ..models.spec import build_model, factory_spec
            model = build_model(factory_spec(self.factory), seed)
        torch.manual_seed(seed)
        self.seed, self._blocks_arg, self._data = seed, blocks, data
        self.model = model if model is not None else GPT(config or GPTConfig.preset(preset))
        self.model.to(self.device).train()
        self.config = getattr(self.model, "config", None)
        self.adapter = adapt(self.model, blocks)
        self._own_batches = batch_fn is not None
        if batch_fn is None:
            vocab = self.adapter.vocab_size or 256
            if vocab < 256 and data == "corpus":  # byte tokens would fall outside the vocabulary
                data = "synthetic"
            self.batcher = Batcher(data, device=self.device, seed=seed, vocab_size=vocab)
            batch_fn = self.batcher.get
        if loss_fn is None and self.adapter.kind == "module":
            self.adapter.check_default_loss()
        self.batch_fn, self.loss_fn = batch_fn, loss_fn or self.adapter.loss
        self.defaults = Toggles().replace(**defaults)
        if self.defaults.attention is None and self.adapter.attentions:
            # every run starts from the model's initial attention unless told otherwise
            self.defaults.attention = self.adapter.attention
        self._check_inputs(loss_fn is None)
        self.optimizer = None
        self._opt_name = None
        self._applied: dict = {}  # what apply() last set on the model
        self._scaler = None  # fp16's GradScaler: kept across runs, like the optimizer state
        self._compiled = None
        self._probes: dict[tuple, ProbeResult] = {}
        self._peaks: dict[str, object] = {}
        self._peak_given = peak_tflops
        self.last_autotune = None  # the latest lab.autotune result (kept also after Ctrl-C)
        # one log a day, shared: each Lab is a session in it (two Labs made in the same second of one
        # process are two sessions), numbering its own runs from 0
        session = f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}-{next(_LAB_IDS)}"
        self.log = (RunLog(log_path) if log_path else
                    RunLog(runs_dir() / f"lab-{time.strftime('%Y-%m-%d')}.jsonl", session=session))
        self.log_path, self.log_skipped = self.log.path, self.log.skipped

    def _check_inputs(self, own_loss: bool) -> None:
        """Refuse, before any training, defaults no run could use, and a batch_fn/loss_fn pair
        that does not make one loss: one tiny forward (dry_step), nothing of the model changed."""
        t = self.resolve()
        errors = problems(t, self.env())
        if errors:
            raise ToggleError([f"Lab(...) defaults: {e}" for e in errors])
        # two samples (BatchNorm in training mode needs more than one); a short sequence of
        # tokens, or the length the user's own batch_fn was set up for
        seq = t.seq_len if self._own_batches else min(t.seq_len or 16, 16)
        gens = [self.batcher.generator] if not self._own_batches else []
        with self._matmul_precision(t):
            dry_step(self.model, self.batch_fn, self.loss_fn, min(2, t.micro_batch), seq,
                     loss_name="the model's own loss" if own_loss else "loss_fn",
                     context=lambda: self._autocast(t), generators=gens)

    # --- data -------------------------------------------------------------------------------

    def batch(self, micro_batch: int, seq_len: int):
        """(x, y) for one micro-batch, on the lab's device."""
        return self.batch_fn(micro_batch, seq_len)

    # --- toggles ----------------------------------------------------------------------------

    def env(self) -> Env:
        """What this machine and model allow (used to explain refused toggles)."""
        cuda = self.device.type == "cuda"
        return Env(device_type=self.device.type,
                   bf16_supported=torch.cuda.is_bf16_supported() if cuda else True,
                   flash_installed=registry.module_available("flash_attn"),
                   unavailable_optimizers=unavailable_optimizers(self.device.type),
                   block_size=self.adapter.max_seq_len,
                   can_set_attention=bool(self.adapter.attentions),
                   can_checkpoint=self.adapter.can_checkpoint, model=type(self.model).__name__)

    def resolve(self, **changes) -> Toggles:
        """The full toggles a run with ``changes`` would use (defaults filled in)."""
        t = self.defaults.replace(**changes)
        if t.seq_len is None:
            # a model of tokens: its position limit; your own batch_fn: 1 (tokens/s counts samples)
            t = t.replace(seq_len=self.adapter.default_seq_len(self.device.type)
                          or (1 if self._own_batches else None))
        if isinstance(t.attention, str) and t.attention in registry.ATTENTION_ALIASES:
            t = t.replace(attention=registry.attention(t.attention).name)  # "eager" is math
        return t

    def check(self, t: Toggles, steps: int = 1, warmup: int = 0) -> list[str]:
        """Why ``t`` cannot run here (empty list: it can)."""
        out = problems(t, self.env())
        if not is_whole(steps) or steps < 1:
            out.append(f"steps must be a whole number >= 1 (got {steps!r}): nothing would be timed.")
        if not is_whole(warmup) or warmup < 0:
            out.append(f"warmup must be a whole number >= 0 (got {warmup!r}).")
        if t.seq_len is None:
            out.append(f"seq_len is needed: {type(self.model).__name__} has no known position "
                       "limit to take it from (lab.run(seq_len=...) or Lab(..., seq_len=...)).")
        return out

    # --- the live model: toggles, one step, clean-up ----------------------------------------

    def apply(self, t: Toggles, notes: list | None = None) -> list:
        """Put ``t`` on the live model and optimizer (attention, checkpointing, optimizer, lr,
        compile); returns ``notes`` with what changed beyond the toggles themselves."""
        notes = [] if notes is None else notes
        a = self.adapter
        for what, now, wanted, applied in (("attention", a.attention, t.attention, self._applied.get("attention")),
                                           ("checkpointing", a.checkpointing, t.checkpointing,
                                            self._applied.get("checkpointing"))):
            if applied is not None and now != applied and now != wanted:
                notes.append(f"{what} was {now!r} on the model (changed outside the Lab): "
                             f"set to this run's {wanted!r}")
        if t.attention is not None and a.attentions and t.attention != a.attention:
            a.set_attention(t.attention)
        if a.can_checkpoint and t.checkpointing != a.checkpointing:
            a.set_checkpointing(t.checkpointing)
        self._applied = {"attention": a.attention, "checkpointing": a.checkpointing}
        if self._opt_name != t.optimizer:
            if self.optimizer is not None:
                notes.append(f"new optimizer {t.optimizer} (was {self._opt_name}): its state starts empty")
            self.optimizer = self._scaler = None  # drop the old state before allocating anew
            self.optimizer = build_optimizer(t.optimizer, self.model.parameters(), t.lr)
            self._opt_name = t.optimizer
        for group in self.optimizer.param_groups:
            group["lr"] = t.lr
        if t.compile and self._compiled is None:
            self._compiled = torch.compile(self.model)
        return notes

    def grad_scaler(self, t: Toggles):
        """The GradScaler for an fp16 run (None otherwise). It lives as long as the optimizer:
        a fresh one would restart at scale 2**16 and skip the first steps of every run."""
        if not registry.PRECISIONS[t.precision].grad_scaler:
            return None
        if self._scaler is None:
            self._scaler = torch.amp.GradScaler(self.device.type)
        return self._scaler

    def _autocast(self, t: Toggles):
        return autocast(t, self.device)

    def _matmul_precision(self, t: Toggles):
        return matmul_precision(t, self.device)

    def train_step(self, t: Toggles):
        """One optimizer step under ``t`` (``apply(t)`` first): ``grad_accum`` micro-batches of
        forward and backward, then the optimizer. Returns the summed loss (a tensor)."""
        fwd = self._compiled if t.compile else self.model
        scaler = self.grad_scaler(t)
        total = None
        with self._matmul_precision(t):
            for _ in range(t.grad_accum):
                x, y = self.batch_fn(t.micro_batch, t.seq_len)
                with self._autocast(t):
                    loss = self.loss_fn(fwd, x, y)
                if t.grad_accum > 1:
                    loss = loss / t.grad_accum
                (scaler.scale(loss) if scaler is not None else loss).backward()
                total = loss.detach() if total is None else total + loss.detach()
            if scaler is not None:
                scaler.step(self.optimizer)
                scaler.update()
            else:
                self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return total

    def recover(self) -> None:
        """After a failed or interrupted step: drop half-made gradients (they must not reach the
        next run) and a GradScaler that may have stopped between unscale_() and update()."""
        if self.optimizer is not None:
            self.optimizer.zero_grad(set_to_none=True)
        self.model.zero_grad(set_to_none=True)
        self._scaler = None

    @property
    def cuda_index(self) -> int | None:
        """The CUDA index of the lab's device (None off CUDA)."""
        if self.device.type != "cuda":
            return None
        return self.device.index if self.device.index is not None else torch.cuda.current_device()

    # --- measurement helpers ----------------------------------------------------------------

    def _probe(self, t: Toggles) -> tuple[ProbeResult, str]:
        # the model's own state is part of the key: attention kind, checkpointing, parameter
        # dtypes and train/eval mode, also when changed by hand between runs
        key = (t.micro_batch, t.seq_len, t.precision, self.adapter.state())
        if key in self._probes:
            return self._probes[key], "cached"
        x, y = self.batch(t.micro_batch, t.seq_len)
        with self._matmul_precision(t):
            res = probe_step(self.model, lambda a, b: self.loss_fn(self.model, a, b), x, y,
                             lambda: self._autocast(t))
        res.attention_ran = self.adapter.attention_ran
        # tokens per sample: the batch's sequence length when it has one, else 1 (samples/s)
        shape = tuple(getattr(x, "shape", ()))
        res.per_sample = t.seq_len if len(shape) >= 2 and shape[1] == t.seq_len else 1
        if res.attention_ran == "flash" and self.adapter.shape is not None:
            add_flash_flops(res, self.adapter.shape, t.micro_batch, t.seq_len, self.adapter.checkpointing)
        if len(self._probes) >= 64:  # bounded: one entry per configuration tried
            self._probes.pop(next(iter(self._probes)))
        self._probes[key] = res
        return res, "counted"

    def _peak(self, dtype: str):
        if dtype not in self._peaks:
            from ..measure.peaks import resolve_peak
            self._peaks[dtype] = resolve_peak(self.device, dtype, given=self._peak_given)
        return self._peaks[dtype]


    # --- the run ----------------------------------------------------------------------------

    def run(self, steps: int = 20, warmup: int = 2, progress=None, guard: bool = True,
            trace: bool = False, memory: bool = False, parallel: str | None = None, nproc: int = 1,
            nodes: int = 1, link=None, **changes) -> RunResult:
        """Apply ``changes`` (toggles) to the live model and train ``steps`` timed steps.

        Example: ``lab.run(steps=20, precision="bf16", micro_batch=16)``. ``progress(done, total)``
        is called when the clock starts (done=0) and after each timed step. Refused combinations
        raise ``ToggleError`` (a ValueError) whose ``problems`` explain why, before any work.
        A step whose loss (or, at the end, a weight) is NaN/inf stops the run: it is recorded as
        failed and, with ``guard`` (the default), weights, optimizer and scaler are put back as
        they were before the run; then ``NonFiniteRunError`` is raised. A step whose estimated
        peak memory exceeds the memory available is refused before anything is allocated
        (``WontFitError``, a ToggleError: the estimate, the limit, what to try; tunekit.engine.fit).
        An out-of-memory error that still happens leaves no gradients behind, frees the memory,
        puts weights and optimizer back (with ``guard``) and says what to try. ``trace``/``memory``:
        one extra step after the timed ones runs under torch.profiler (``result.trace``, a
        Breakdown with the profiler's overhead against the timed steps; ``result.memory``, a
        MemoryTimeline); it does not count in tokens/s.


        ``parallel="ddp" | "fsdp" | "fsdp_grad_op" | "hsdp"`` runs ``nodes`` x ``nproc`` worker
        processes instead (tunekit.engine.dist: torch.distributed's elastic agent, gloo on CPU, NCCL on
        CUDA), each building this model from its config (or the Lab's factory string) with the
        Lab's current weights, and training on its slice of the global batch (``micro_batch``
        per rank); ``link={"bandwidth": "50mbit", "latency": "1ms"}`` puts each node in its own
        network namespace. The Lab's own model is not changed by such a run.

        Ctrl-C stops a run in its steps (the FLOP probe's, the warm-up, the timed and the traced
        ones); while it sets up, records or cleans up it waits, a second Ctrl-C too. An
        interrupted run is not a run: it is not recorded, it is undone (with ``guard``), and its
        tensors are freed even while Jupyter keeps the KeyboardInterrupt (its traceback then ends
        here, with a note saying where it stopped).
        """
        if parallel is not None or nproc != 1 or nodes != 1 or link is not None:
            if trace or memory:
                raise ToggleError(["trace/memory trace one process's step: not available with parallel=... "
                                   "(trace a single-process run of the same toggles instead)."])
            return self._run_distributed(steps, warmup, progress, parallel, nproc, nodes, link, changes)
        # Ctrl-C waits while the run sets up, records or is undone: only its steps run in the gate
        with deferred_interrupt() as shield:
            try:
                return self._run(shield, steps, warmup, progress, guard, trace, memory, changes)
            except KeyboardInterrupt as e:  # undone in _run; what its traceback held goes now
                drop_frames(e)
                free_memory(self.device)
                raise

    def _run(self, shield, steps, warmup, progress, guard, trace, memory, changes) -> RunResult:
        t = self.resolve(**changes)
        errors = self.check(t, steps, warmup)
        for what, flag in (("guard", guard), ("trace", trace), ("memory", memory)):
            if not isinstance(flag, bool):
                errors.append(f"{what} must be True or False (got {flag!r}).")
        if errors:
            raise ToggleError(errors)
        t, steps, warmup = normalized(t), int(steps), int(warmup)
        self.log.check_writable()  # fail before training: a finished run is never lost
        notes = self.apply(t, notices(t, self.env()))
        if t.compile and warmup < 1:
            warmup = 1
            notes.append("warm-up raised to 1: the first compiled step compiles")
        self.recover()  # a run that failed earlier (OOM, Ctrl-C) may have left gradients
        # before the FLOP probe and the steps allocate: a CPU out-of-memory kills the process
        fit.check(self, t, guard)
        snap = Snapshot.take(self) if guard else None
        try:
            probe, flops_source = self._probe(t)
            warm = []
            with shield.gate():
                for i in range(warmup):
                    warm.append(self.train_step(t))
                    _check(warm[-1], f"the loss of warm-up step {i + 1}")
            measured = self.measure_steps(t, steps, progress)
            if trace or memory:
                measured.trace, measured.memory = self.traced_step(t, median(measured.times), trace, memory)
            if not weights_finite(self.model):
                raise _NonFinite("a weight after the last step")
        except _NonFinite as e:
            if snap is not None:
                snap.restore()
            undone = ("weights, optimizer and scaler are back as before the run" if snap is not None
                      else "the weights were NOT restored (guard=False)")
            result = self._failed(t, warmup, f"{e} is not finite: the run stopped there; {undone}",
                                  notes, snap)
            raise NonFiniteRunError(result.error, result) from None
        except BaseException as e:
            self._undo(e, snap)
            if is_oom(e):
                drop_frames(e)  # a kept traceback (Jupyter keeps the last) would pin the step's tensors
                free_memory(self.device)
                undone = ""
                if snap is not None:
                    snap.restore()  # an optimizer step cut short may have updated some weights
                    undone = " weights, optimizer and scaler are back as before the run;"
                e.add_note(f"tunekit: lab.run ran out of memory at micro_batch={t.micro_batch}, "
                           f"seq_len={t.seq_len}; its gradients were dropped and memory freed;{undone} "
                           f"{ADVICE}; lab.find_max_batch_size() finds the largest micro-batch that fits.")
            raise
        measured.losses[:0] = warm
        return self._record(t, warmup, measured, probe, flops_source, notes, snap)

    def _undo(self, e: BaseException, snap) -> None:
        """After a run that failed: no gradients left. One interrupted (Ctrl-C) is not a run: it
        is not recorded, and it is undone (with ``guard``); run() then frees its tensors, also
        those its traceback held (cut below run(), with a note saying where it stopped)."""
        self.recover()
        if isinstance(e, KeyboardInterrupt) and snap is not None:
            snap.restore()

    def _run_distributed(self, steps, warmup, progress, parallel, nproc, nodes, link, changes):
        from ..core.comm import layout_problems
        from ..models.spec import factory_spec, model_spec
        from .dist.launch import launch

        t = self.resolve(**changes)
        errors = layout_problems(parallel, nproc, nodes) + self.check(t, steps, warmup)
        if self._own_batches:
            errors.append("a distributed run draws its batches in the workers: a Lab with its own "
                          "batch_fn cannot run one (use the built-in data, or train with torchrun)")
        if self.loss_fn != self.adapter.loss:
            errors.append("a loss_fn cannot travel to worker processes: a distributed run uses the "
                          "model's own loss")
        if not isinstance(self._data, str):
            errors.append("a distributed run draws 'corpus' or 'synthetic' data in the workers; "
                          "data given as bytes or a tensor cannot travel to them")
        if self._blocks_arg is not None and not isinstance(self._blocks_arg, str):
            errors.append("blocks given as modules cannot travel to worker processes: name them by "
                          "attribute path, e.g. Lab(model, blocks='layers')")
        spec_model = None
        try:
            spec_model = factory_spec(self.factory) if self.factory else model_spec(self.model)
        except ValueError as e:
            errors.insert(0, str(e))
        if errors:
            raise ToggleError(errors)
        t = normalized(t)
        fit.check_distributed(self, t, parallel, nproc, nodes)  # before any rank starts
        self.log.check_writable()
        dtype = compute_dtype(t, self.device.type)
        peak = self._peak(dtype)
        import tempfile

        with tempfile.TemporaryDirectory(prefix="tunekit-weights-") as tmp:
            weights = Path(tmp) / "weights.pt"
            torch.save(getattr(self.model, "_orig_mod", self.model).state_dict(), weights)
            spec = {"model": spec_model, "parallel": parallel, "toggles": t.asdict(),
                    "steps": int(steps), "warmup": int(warmup), "seed": self.seed,
                    "data": self._data,
                    "weights": str(weights), "peak_tflops": peak.tflops, "peak_source": peak.source,
                    "device": self.device.type, **({"blocks": self._blocks_arg} if self._blocks_arg else {})}
            result = launch(spec, nproc, nodes=nodes, link=link, progress=progress)
        result.label = f"{parallel} {nodes}x{nproc} {label(t, self.resolve())}"
        # the workers know the peak only as a number: here its kind is known, and a calibrated
        # one can be re-checked now that they are done
        r = rates(result.flops_per_step, result.model_flops_per_step, result.step_s, peak, self.device, dtype,
                  devices=result.world_size or 1)
        self._peaks[dtype] = r.peak
        result.mfu, result.hfu, result.above_peak = r.mfu, r.hfu, r.above_peak
        result.peak_tflops, result.peak_tflops_source = r.peak.tflops, r.peak.source
        result.notes.append("the workers started from the Lab's weights; the Lab's model is "
                            "unchanged by a distributed run")
        return self.log.add(result)

    def measure_steps(self, t: Toggles, steps: int, progress=None) -> Steps:
        """``steps`` timed training steps under ``t`` (applied already), with the peak memory of
        the device over them. The peak meter always stops, also when a step fails; a step whose
        loss is not finite stops the steps (``_NonFinite``)."""
        with deferred_interrupt() as shield:  # the meter goes on and off whole; the steps run in the gate
            meter = DeviceMeter(self.device, self.cuda_index).start()
            slowed = counting_active()  # an enclosing %%gpuprofile's first run is counting
            losses, peak = [], None
            energy = EnergyMeter(self.cuda_index).start()
            conditions = ConditionsMeter(self.cuda_index)

            def tick(i, _s):  # after the step's clock: the finiteness check syncs, the clock did too
                _check(losses[-1], f"the loss of step {i + 1}")
                if progress is not None:
                    progress(i + 1, steps)

            try:
                with shield.gate():
                    if progress is not None:
                        progress(0, steps)  # warm-up and FLOP count are done: the clock starts
                    conditions.start()
                    t0 = time.perf_counter()
                    times = time_repeats(lambda: losses.append(self.train_step(t)), self.device,
                                         warmup=0, repeats=steps, after_each=tick)
                    wall = time.perf_counter() - t0
                cond = conditions.stop(wall)
                used = energy.stop(wall)
            finally:
                peak = meter.stop()
        return Steps(times, losses, peak, meter.source, slowed, used, meter.last, conditions=cond)

    def traced_step(self, t: Toggles, step_s: float, trace: bool = True, memory: bool = False):
        """One more training step under torch.profiler: (Breakdown or None, MemoryTimeline or
        None); ``step_s``, the untraced step time, gives the profiler's overhead."""
        from ..measure.trace import Tracer

        with deferred_interrupt() as shield:  # the profiler goes on and off whole; the step runs in the gate
            tracer = Tracer(f"lab-{label(t, self.resolve())}", trace, memory, self.cuda_index).start()
            losses = []
            try:
                with shield.gate():
                    wall = time_repeats(lambda: losses.append(self.train_step(t)), self.device, warmup=0,
                                        repeats=1)[0]
            except BaseException:
                tracer.stop(math.nan)
                raise
            breakdown, timeline = tracer.stop(wall)
        _check(losses[0], "the loss of the traced step")
        if breakdown is not None:
            breakdown.compare_with(step_s)
            breakdown.notes.append("one extra step after the timed ones; overhead against their median")
        return breakdown, timeline

    def _record(self, t, warmup, m: Steps, probe, flops_source, notes, snap=None) -> RunResult:
        step_s = sum(m.times) / len(m.times)
        tokens = t.micro_batch * t.grad_accum * probe.per_sample
        if probe.per_sample != t.seq_len:
            notes.append(f"the batch has no sequence dimension of seq_len={t.seq_len}: "
                         "tokens/s counts samples")
        executed = probe.flops.executed * t.grad_accum if probe.flops.executed else None
        counted = probe.flops.model * t.grad_accum if probe.flops.executed else None
        model_flops, convention, why = self.adapter.model_flops(t.seq_len, tokens, counted)
        notes.extend(why)
        if executed is None:
            flops_source = "none"
        if m.slowed:
            notes.append("timed under an outer FLOP counter (a first %%gpuprofile run?): "
                         "step times are slowed by it, so no TFLOPS/MFU; re-run for clean speeds")
        dtype = compute_dtype(t, self.device.type)
        rate_s = math.nan if m.slowed else step_s  # rates from a counter-slowed clock would lie
        r = rates(executed, model_flops, rate_s, self._peak(dtype), self.device, dtype)
        self._peaks[dtype] = r.peak  # a re-check may have raised a calibrated peak
        params = list(self.model.parameters())
        values = [float(v) for v in m.losses]  # after the clock: .item() would sync mid-run
        ac = autocast_dtype(t)
        result = RunResult(
            run_id=None, label=label(t, self.resolve()), toggles=t,
            steps=len(m.times), warmup=warmup, tokens_per_step=tokens, tokens_per_s=tokens / step_s,
            step_s=step_s, step_s_min=min(m.times), step_s_max=max(m.times),
            flops_per_step=executed, model_flops_per_step=model_flops, flops_source=flops_source,
            tflops=r.tflops, mfu=r.mfu, hfu=r.hfu, above_peak=r.above_peak,
            peak_tflops=r.peak.tflops, peak_tflops_source=r.peak.source,
            peak_mem_bytes=m.peak_mem_bytes, peak_mem_source=m.peak_mem_source,
            params_bytes=sum(p.numel() * p.element_size() for p in params),
            grads_bytes=sum(p.numel() * p.element_size() for p in params if p.requires_grad),
            mfu_convention=convention, optimizer_bytes=state_bytes(self.optimizer),
            saved_bytes=probe.saved_bytes,
            weight_cast_bytes=probe.cast_bytes, loss=values[-1], loss_first=values[0],
            device=device_label(self.cuda_index), attention_ran=probe.attention_ran,
            compute_dtype=dtype, autocast_dtype=registry.dtype(ac).torch_name if ac else None,
            model=type(self.model).__name__, n_params=sum(p.numel() for p in params),
            time=time.strftime("%Y-%m-%dT%H:%M:%S"), notes=notes + probe.notes,
            guard_s=snap.seconds if snap is not None else None, trace=m.trace, memory=m.memory,
            conditions=m.conditions)
        if m.energy is not None:
            e = m.energy
            result.energy_j, result.energy_source, result.mean_w = e.joules, e.source, e.mean_w
            result.j_per_token = e.joules / (tokens * len(m.times))
            result.notes.extend([e.note] if e.note else [])
        result.gpu_alloc_retries, result.gpu_ooms = (m.alloc or {}).get("gpu_alloc_retries"), \
            (m.alloc or {}).get("gpu_ooms")
        return self.log.add(result)

    def _failed(self, t, warmup, reason: str, notes, snap) -> RunResult:
        return self.log.add(RunResult.failed(
            t, label(t, self.resolve()), reason, notes, warmup=warmup, model=type(self.model).__name__,
            device=device_label(self.cuda_index), guard_s=snap.seconds if snap is not None else None))

    def save_results(self, path) -> Path:
        """Append every run of this Lab to the JSONL log ``path`` (e.g. when the Lab's own log
        could not be written). Returns the path."""
        return self.log.save_to(path)

    # --- results ----------------------------------------------------------------------------

    @property
    def runs(self) -> list[RunResult]:
        return list(self.log.runs)

    def results(self):
        """pandas DataFrame, one row per run (this session's and the log's earlier ones)."""
        from ..core.results import runs_view
        from ..core.summary import readable

        return readable(results_frame(self.log.runs), runs_view)

    def compare(self, baseline: int = 0):
        """plotly Figure: tokens/s and peak memory per run, the ``baseline`` run marked."""
        from ..ui.lab_plots import compare_figure
        return compare_figure(self.results(), baseline=baseline)

    def find_max_batch_size(self, **kwargs):
        """Largest micro-batch that fits for the current toggles; see ``tunekit.engine.maxbatch``."""
        from .maxbatch import find_max_batch_size
        return find_max_batch_size(self, **kwargs)

    def autotune(self, budget_s: float = 60.0, objective: str = "tokens_per_s", **kwargs):
        """The fastest configuration that fits, searched within ``budget_s`` seconds; returns an
        ``AutotuneResult`` (winner, evidence table, figure). See ``tunekit.engine.autotune``.

        Example: ``found = lab.autotune(budget_s=120, keep_global_batch=True)``."""
        from .autotune import autotune
        return autotune(self, budget_s, objective, **kwargs)

    def dashboard(self):
        """ipywidgets dashboard over this lab (controls, Run, Find max batch, table, charts)."""
        from ..ui.dashboard import Dashboard
        return Dashboard(self)

    @staticmethod
    def load_results(path=None):
        """DataFrame of the runs in a JSONL log written by a Lab (partial last lines skipped).

        ``path=None``: the newest day's log under ``core.paths.runs_dir()`` (after a kernel restart,
        say), every Lab of that day; its ``session`` column tells the Labs apart:
        ``df[df.session == df.session.iloc[-1]]`` is the latest Lab's runs."""
        return results_frame(RunLog.newest(runs_dir()) if path is None else RunLog.load(path))
