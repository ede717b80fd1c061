"""What `tunekit.plan` plans: the model (built from its config inside the fake mode), its
longest sequence and its name. Engine layer."""
from __future__ import annotations

import contextlib

import torch


@contextlib.contextmanager
def masks_as_in_eager(kind):
    """transformers cannot read a fake tensor's values, so it cannot see that the planned batch
    packs one sequence per row, builds an explicit causal mask and repeats the KV heads where an
    eager run passes ``is_causal`` and GQA to SDPA (other saved tensors). While the plan steps,
    its packed-sequence finder answers what it answers for such a batch: none packed.
    tests/test_plan.py's byte-exact transformers test is the canary."""
    utils = None
    if kind == "hf":
        import importlib

        try:
            utils = importlib.import_module("transformers.masking_utils")
        except ImportError:
            utils = None
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

def config_of(target):
    from ...models.gpt import GPTConfig

    if isinstance(target, GPTConfig):
        return target, "gpt", {}
    if type(target).__name__ == "Lab":
        t = target.resolve()   # the toggles a run starts from, defaults filled in
        toggles = dict(precision=t.precision, micro_batch=t.micro_batch, seq_len=t.seq_len,
                       checkpointing=t.checkpointing, optimizer=t.optimizer, attention=t.attention)
        cfg = getattr(target.model, "config", None)
        kind = "gpt" if isinstance(cfg, GPTConfig) else "hf"
        if kind == "hf" and not hasattr(cfg, "model_type"):
            raise ValueError("tunekit.plan needs a Lab on tunekit's GPT or a transformers model (a config to build)")
        return cfg, kind, toggles
    if hasattr(target, "model_type") and hasattr(target, "to_dict"):
        return target, "hf", {}
    raise TypeError(f"tunekit.plan takes a GPTConfig, a transformers config or a Lab, got {type(target).__name__}: "
                    "build your model from a config (no weights are needed)")


def max_len(cfg, kind) -> int:
    return cfg.block_size if kind == "gpt" else int(getattr(cfg, "max_position_embeddings", 2048) or 2048)


def model_name(cfg, kind) -> str:
    if kind == "gpt":
        return f"GPT (n_layer={cfg.n_layer}, n_embd={cfg.n_embd})"
    return f"{type(cfg).__name__.removesuffix('Config')} (hidden={cfg.hidden_size}, layers={cfg.num_hidden_layers})"


def build(cfg, kind, dtype):
    """The model, its parameters made in ``dtype`` (None: fp32) as they are created."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype or torch.float32)
    try:
        if kind == "gpt":
            from ...models.gpt import GPT

            return GPT(cfg)
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_config(cfg, dtype=dtype or torch.float32)
    finally:
        torch.set_default_dtype(previous)
