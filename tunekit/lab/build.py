"""How a Lab is made (``Lab.__init__``'s body): every argument checked before anything is built,
the model built (or a factory's called) and placed, its batches, its TrainStep, its run log; then
its defaults and a batch refused by one dry forward before any training. And what the Lab's
machine and model allow (`env`), and the step ``measure_memory(lab)`` measures (`memory_target`).
"""
from __future__ import annotations

import itertools
import os
import time

import torch

from tunekit.core import registry
from tunekit.core.paths import runs_dir
from tunekit.core.toggles import Env, ToggleError, Toggles, problems
from tunekit.core.validate import function, instance, real, whole
from tunekit.lab.runlog import RunLog, check_log_path
from tunekit.measure.device import default_device, existing_device
from tunekit.models.adapters import adapt
from tunekit.models.dry_step import dry_step
from tunekit.models.encoders import refuse_encoder
from tunekit.models.gpt import GPT, GPTConfig
from tunekit.models.naming import blocks_example, model_label
from tunekit.models.optimizers import unavailable_optimizers
from tunekit.train.precision import autocast, matmul_precision
from tunekit.train.record import Peaks
from tunekit.train.step import TrainStep, token_batcher

_LAB_IDS = itertools.count()


def build(lab, model, batch_fn, loss_fn, preset, config, data, device, log_path, peak_tflops, seed, blocks,
          defaults: dict) -> None:
    """Fill a new ``lab`` from ``Lab(...)``'s arguments (see `Lab`), checking each first; a build
    over 2 s (a 124M GPT's weights, a busy machine) shows what it is doing (`view.progress`)."""
    from tunekit.view.progress import wait_progress

    with wait_progress("tunekit.Lab", True) as shown:
        _build(lab, model, batch_fn, loss_fn, preset, config, data, device, log_path, peak_tflops, seed, blocks,
               defaults, shown)


def _build(lab, model, batch_fn, loss_fn, preset, config, data, device, log_path, peak_tflops, seed, blocks,
           defaults: dict, shown) -> None:
    if model is not None and not isinstance(model, str):
        instance("model", model, torch.nn.Module, "None, an nn.Module instance or a factory 'package.module:function'")
    for name, fn, takes in (("batch_fn", batch_fn, "(micro_batch, seq_len) -> (x, y)"),
                            ("loss_fn", loss_fn, "(model, x, y) -> loss")):
        if fn is not None:
            function(name, fn, takes)
    seed = whole("seed", seed, 0)
    peak_tflops = real("peak_tflops", peak_tflops) if peak_tflops is not None else None
    if log_path is not None:
        check_log_path(log_path)
    lab.device = existing_device(device) if device is not None else default_device()
    lab.factory = model if isinstance(model, str) else None  # "package.module:function"
    shown.at("building the model")
    if lab.factory is not None:
        from tunekit.models.spec import build_model, factory_spec
        model = build_model(factory_spec(lab.factory), seed)
    torch.manual_seed(seed)
    lab.seed, lab.blocks, lab.data = seed, blocks, data  # as given: distributed runs send them
    model = model if model is not None else GPT(config or GPTConfig.preset(preset))
    if loss_fn is None:   # the built-in next-token loss: an encoder would read the token it predicts
        refuse_encoder(getattr(getattr(model, "_orig_mod", model), "config", None), "tunekit.Lab")
    model.to(lab.device).train()
    lab.config = getattr(model, "config", None)
    adapter = adapt(model, blocks)
    # the built-in batches (None: the Lab's own batch_fn draws them)
    shown.at("checking one step of it on two samples")
    lab.batcher = token_batcher(adapter, data, lab.device, seed) if batch_fn is None else None
    if loss_fn is None and adapter.kind == "module":
        adapter.check_default_loss()
    lab.trainer = TrainStep(model, adapter, lab.device, batch_fn or lab.batcher.get, loss_fn or adapter.loss)
    # attention and checkpointing left out are the model's own (as given, or as changed by hand
    # since): None, filled in by `resolve`
    lab.defaults = Toggles().replace(**{"checkpointing": None, **defaults})
    check_inputs(lab, loss_fn is None)
    lab.peaks = Peaks(lab.device, peak_tflops)  # compute dtype -> the peak its MFU is measured against
    lab.last_autotune = None  # the latest lab.autotune result (kept also after Ctrl-C)
    # one log a day, shared: each Lab is a session in it (two Labs made in the same second of one
    # process are two sessions), numbering its own runs from 0
    session = f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}-{next(_LAB_IDS)}"
    lab.log = (RunLog(log_path) if log_path is not None else
               RunLog(runs_dir() / f"lab-{time.strftime('%Y-%m-%d')}.jsonl", session=session))
    lab.log_path, lab.log_skipped = lab.log.path, lab.log.skipped


def check_inputs(lab, own_loss: bool) -> None:
    """Refuse, before any training, defaults no run could use, and a batch_fn/loss_fn pair
    that does not make one loss: one tiny forward (dry_step), nothing of the model changed."""
    t = lab.resolve()
    errors = problems(t, lab.env())
    if errors:
        raise ToggleError([f"Lab(...) defaults: {e}" for e in errors])
    # two samples (BatchNorm in training mode needs more than one); a short sequence of
    # tokens, or the length the user's own batch_fn was set up for
    own_batches = lab.batcher is None
    seq = t.seq_len if own_batches else min(t.seq_len or 16, 16)
    gens = [lab.batcher.generator] if not own_batches else []
    with matmul_precision(t, lab.device):
        dry_step(lab.model, lab.batch_fn, lab.loss_fn, min(2, t.micro_batch), seq,
                 loss_name="the model's own loss" if own_loss else "loss_fn",
                 context=lambda: autocast(t, lab.device), generators=gens)


def env(lab) -> Env:
    """What ``lab``'s machine and model allow (used to explain refused toggles)."""
    cuda = lab.device.type == "cuda"
    return Env(device_type=lab.device.type,
               bf16_supported=torch.cuda.is_bf16_supported() if cuda else True,
               flash_installed=registry.module_available("flash_attn"),
               unavailable_optimizers=unavailable_optimizers(lab.device.type),
               block_size=lab.adapter.max_seq_len,
               can_set_attention=bool(lab.adapter.attentions),
               can_checkpoint=lab.adapter.can_checkpoint, model=model_label(lab.model),
               blocks_example=blocks_example(lab.model))


def memory_target(lab, micro_batch: int | None = None, seq_len: int | None = None, batch=None):
    """What ``measure_memory(lab)`` measures (a measure.memory.StepTarget): the live model and
    loss under the default toggles, on ``batch`` or one of the Lab's batches."""
    from tunekit.measure.memory import StepTarget

    t = lab.model_state(lab.defaults)
    micro_batch = micro_batch or t.micro_batch or 4
    seq_len = seq_len or t.seq_len or lab.adapter.default_seq_len("cpu") or 64
    batch = batch if batch is not None else lab.batch(micro_batch, seq_len)
    return StepTarget(lab.model, lab.adapter, batch, lambda m, b: lab.loss_fn(m, *b), t.optimizer,
                      t.precision, bool(t.checkpointing), t.attention)
