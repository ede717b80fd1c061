"""What `tunekit.plan` plans: the model (built from its config inside the fake mode, or a
module's fake twin: plan.module), its longest sequence, its name and what a micro-batch
counts."""
from __future__ import annotations

import contextlib
import copy
import sys

import torch

from tunekit.core import validate
from tunekit.core.extras import missing_extra
from tunekit.models.encoders import refuse_encoder
from tunekit.planning.module import ModuleTarget, Stepped


@contextlib.contextmanager
def masks_as_in_eager(kind):
    """transformers cannot read a fake tensor's values, so it cannot see that the planned batch
    packs one sequence per row, builds an explicit causal mask and repeats the KV heads where an
    eager run passes ``is_causal`` and GQA to SDPA (other saved tensors). While the plan steps,
    its packed-sequence finder answers what it answers for such a batch: none packed.
    tests/planning/test_plan.py's byte-exact transformers test is the canary."""
    utils = None
    if kind == "hf":
        import importlib

        try:
            utils = importlib.import_module("transformers.masking_utils")
        except ImportError:
            utils = None
    elif kind == "module":   # a module of the user's: a transformers model inside it imported them already
        utils = sys.modules.get("transformers.masking_utils")
    if utils is None or not hasattr(utils, "find_packed_sequence_indices"):
        yield
        return
    before = utils.find_packed_sequence_indices
    utils.find_packed_sequence_indices = lambda position_ids: None
    try:
        yield
    finally:
        utils.find_packed_sequence_indices = before


# --- the target ---------------------------------------------------------------------------------

def config_of(target, batch_fn=None, loss_fn=None, blocks=None):
    """(what to build, its kind, the step words it brings: Setting fields -> values): a config
    ("gpt", "hf") built as it is, or a `ModuleTarget` for an nn.Module and a Lab on one of the
    user's own ("gpt", "hf" when it trains as a config would, else "module"). Bad input is
    refused here, before any work."""
    from tunekit.models.gpt import GPTConfig

    if isinstance(target, type):
        name = target.__name__
        raise TypeError(f"tunekit.plan takes an instance, got the class {name}: pass {name}(...) (on the meta "
                        f"device it takes no memory: with torch.device('meta'): m = {name}(...))")
    for name, fn, takes in (("batch_fn", batch_fn, "(micro_batch, seq_len) -> (x, y)"),
                            ("loss_fn", loss_fn, "(model, x, y) -> loss")):
        if fn is not None:
            validate.function(name, fn, takes)
    own = (batch_fn, loss_fn, blocks) != (None, None, None)
    if isinstance(target, torch.nn.Module):
        module = ModuleTarget(target, batch_fn, loss_fn, blocks)
        return module, module.kind, module.toggles()
    if type(target).__name__ == "Lab":
        return _lab_target(target, batch_fn, loss_fn, blocks)
    if own:
        raise TypeError("batch_fn, loss_fn and blocks go with an nn.Module target: build the model (on the meta "
                        "device it takes no memory) and plan it, tunekit.plan(model, ..., batch_fn=...)")
    if isinstance(target, GPTConfig):
        return target, "gpt", {}
    if isinstance(target, str):   # a preset's name, as `tunekit plan --model` and Lab(preset=) take it
        return GPTConfig.preset(target), "gpt", {}
    if hasattr(target, "model_type") and hasattr(target, "to_dict"):
        refuse_encoder(target, "tunekit.plan")   # it would build a causal LM the config is not
        return target, "hf", {}
    raise TypeError(f"tunekit.plan takes a GPTConfig (or a preset's name), a transformers config, an nn.Module "
                    f"or a Lab, got "
                    f"{type(target).__name__}")


def _lab_target(lab, batch_fn, loss_fn, blocks):
    """A Lab's model and the step its next run would take (`lab_setting`): its config when it
    trains tunekit's GPT or a transformers model on the built-in batches and loss, else its model
    with its batches (its own batch_fn, or the built-in ones), loss_fn and blocks."""
    words = lab_setting(lab)
    own_loss = lab.loss_fn != lab.adapter.loss   # the Lab's default is its adapter's loss
    cfg = getattr(lab.model, "config", None)
    kind = {"tunekit-gpt": "gpt", "transformers": "hf"}.get(lab.adapter.kind)
    if kind and lab.batcher is not None and not own_loss and lab.blocks is None \
            and (batch_fn, loss_fn, blocks) == (None, None, None):
        return cfg, kind, words
    module = ModuleTarget(lab.model, batch_fn or lab.batch_fn, loss_fn or (lab.loss_fn if own_loss else None),
                          blocks if blocks is not None else lab.blocks)
    return module, module.kind, {**module.toggles(), **words}


def lab_setting(lab, **changes) -> dict:
    """The step words (`core.setting.Setting`'s fields) of the run ``lab.run(**changes)`` would
    take, those it leaves None left out: ``lab.setting_of(**changes)``, the one Setting every
    entry point of the Lab makes (every declared toggle, and the weights' dtype where the live
    model keeps them in bf16/fp16)."""
    return {k: v for k, v in lab.setting_of(**changes).asdict().items() if v is not None}


def max_len(cfg, kind) -> int | None:
    """The longest sequence the model takes (None: a module without a position limit)."""
    if isinstance(cfg, ModuleTarget):
        return max_len(cfg.config, cfg.inner_kind) if cfg.config is not None else None
    return cfg.block_size if kind == "gpt" else int(getattr(cfg, "max_position_embeddings", 2048) or 2048)


def model_name(cfg, kind) -> str:
    if isinstance(cfg, ModuleTarget):
        return model_name(cfg.config, cfg.kind) if cfg.kind != "module" else cfg.name
    if kind == "gpt":
        return f"GPT (n_layer={cfg.n_layer}, n_embd={cfg.n_embd})"
    return f"{type(cfg).__name__.removesuffix('Config')} (hidden={cfg.hidden_size}, layers={cfg.num_hidden_layers})"


def amount(cfg, kind, micro_batch: int, seq_len: int) -> tuple[int, str]:
    """(tokens or samples in one micro-batch, "tokens" or "samples"); call it inside the fake mode."""
    return cfg.amount(micro_batch, seq_len) if isinstance(cfg, ModuleTarget) else (micro_batch * seq_len, "tokens")


def build(cfg, kind, dtype):
    """The model, its parameters made in ``dtype`` (None: fp32) as they are created; a module's
    fake twin (None: its own dtypes)."""
    if isinstance(cfg, ModuleTarget):
        return cfg.build(dtype)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype or torch.float32)
    try:
        if kind == "gpt":
            from tunekit.models.gpt import GPT

            return GPT(cfg)
        try:
            from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM
        except ModuleNotFoundError as e:
            raise (missing_extra(e, "planning a transformers config") or e) from None

        # an encoder-decoder (T5, BART) trains as one: AutoModelForCausalLM has no T5, and BART's is its
        # decoder alone
        auto = AutoModelForSeq2SeqLM if getattr(cfg, "is_encoder_decoder", False) else AutoModelForCausalLM
        # on a copy: the model keeps its config, and a plan's attention must not switch the user's (or a Lab's)
        return auto.from_config(copy.deepcopy(cfg), dtype=dtype or torch.float32)
    finally:
        torch.set_default_dtype(previous)


def set_attention(model, attention, notes) -> None:
    """The built model's attention switched to ``attention`` (None: its own); flash is planned as
    torch's fused SDPA (said in ``notes``)."""
    if attention is None:
        return
    from tunekit.core.registry import attention as resolve
    from tunekit.models.adapters import adapt

    name = resolve(attention).name
    adapter = model.adapter if isinstance(model, Stepped) else adapt(model)
    if name == "flash":   # flash-attn needs CUDA: CPU's fused SDPA saves the same (output, logsumexp)
        notes.append("attention='flash' planned as torch's fused SDPA, which saves the same tensors for backward")
        name = "sdpa"
    if name not in adapter.attentions:
        raise ValueError(f"this model cannot switch its attention to {attention!r}: it offers {adapter.attentions}")
    adapter.set_attention(name)


def window_notes(cfg, kind, seq_len: int | None, attention: str | None) -> list:
    """A transformers config with a sliding attention window shorter than the planned sequence
    (Mistral's sliding_window): sdpa and eager attention mask the window inside a full S x S
    score computation, as the plan counts it, so the window saves nothing there; transformers'
    flash_attention_2 computes the window alone (not planned: a note of kind plan.sliding_window)."""
    from tunekit.core.notes import Note

    config = cfg.config if isinstance(cfg, ModuleTarget) else cfg if kind == "hf" else None
    window = getattr(config, "sliding_window", None)
    if not isinstance(window, int) or seq_len is None or window >= seq_len \
            or not getattr(config, "use_sliding_window", True):
        return []
    ran = attention or getattr(config, "_attn_implementation", None) or "sdpa"
    return [Note("plan.sliding_window",
                 f"sliding_window={window} is planned as attention over full {seq_len} x {seq_len} scores: torch's "
                 f"SDPA and eager attention mask the window inside the full scores, so with attention {ran!r} as "
                 "planned the window saves no time nor memory; transformers' flash_attention_2 (attention='flash' "
                 "on a GPU with flash-attn) computes only the window, which the plan does not model")]
