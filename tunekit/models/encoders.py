"""Bidirectional encoders (BERT, RoBERTa, ELECTRA, ...): what tunekit's built-in step cannot train.

tunekit's step for a transformers model is next-token prediction (labels = the input shifted
by one). An encoder attends to every position, the one it predicts included, so that loss
teaches nothing and its figures mean nothing: the Lab and `tunekit.plan` of a config refuse
such a model before any work, and say what is supported (decoders, encoder-decoders, or the
user's own objective through ``batch_fn``/``loss_fn``).

    >>> refuse_encoder(BertConfig(), "tunekit.Lab")   # ValueError naming what is supported
"""
from __future__ import annotations


def is_encoder_only(config) -> bool:
    """True for a transformers config of a bidirectional encoder: its model type has a masked-LM
    head in transformers (``MODEL_FOR_MASKED_LM_MAPPING_NAMES``) and it is set up neither as a
    decoder (``is_decoder``, BERT's causal variant) nor as an encoder-decoder (BART, T5)."""
    model_type = getattr(config, "model_type", None)
    if model_type is None or getattr(config, "is_decoder", False) or getattr(config, "is_encoder_decoder", False):
        return False
    try:
        from transformers.models.auto.modeling_auto import MODEL_FOR_MASKED_LM_MAPPING_NAMES
    except ImportError:   # no transformers: no transformers config either
        return False
    return model_type in MODEL_FOR_MASKED_LM_MAPPING_NAMES


def refuse_encoder(config, where: str) -> None:
    """Raise ValueError when ``config`` is an encoder's (`is_encoder_only`): ``where`` names the
    entry point ("tunekit.Lab", "tunekit.plan") and how to give it an objective of one's own."""
    if not is_encoder_only(config):
        return
    name = type(config).__name__.removesuffix("Config")
    raise ValueError(
        f"{name} is a bidirectional encoder: {where} trains transformers decoders (causal LMs: Llama, "
        f"Mistral, GPT-2, ...; or a config with is_decoder=True) and encoder-decoders (T5, BART) on "
        f"next-token prediction, which an encoder would learn by reading the token it predicts. For a "
        f"masked-LM step give your own objective: {where}(model, batch_fn=lambda micro_batch, seq_len: "
        f"(input_ids, labels), loss_fn=lambda model, x, labels: model(input_ids=x, labels=labels).loss) "
        f"with labels -100 outside the masked positions")


__all__ = ["is_encoder_only", "refuse_encoder"]
