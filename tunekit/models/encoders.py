"""Bidirectional encoders (BERT, RoBERTa, ELECTRA, ...): what tunekit's built-in step cannot train.

tunekit's step for a transformers model is next-token prediction (labels = the input shifted
by one). An encoder attends to every position, the one it predicts included, so that loss
teaches nothing and its figures mean nothing: the Lab and `tunekit.plan` of a config refuse
such a model before any work, and say what is supported (decoders, encoder-decoders, or the
user's own objective through ``batch_fn``/``loss_fn``); so too an encoder-decoder whose config
cannot turn labels into the decoder's inputs (no ``decoder_start_token_id``).

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
    """Raise ValueError when the built-in step cannot train ``config``'s model: an encoder's
    (`is_encoder_only`), or an encoder-decoder's without a ``decoder_start_token_id`` (transformers
    builds the decoder's inputs from the labels behind that token: a T5Config made from scratch
    has none, and the step failed deep inside T5's ``_shift_right``). ``where`` names the entry
    point ("tunekit.Lab", "tunekit.plan") and how to give it an objective of one's own."""
    name = type(config).__name__.removesuffix("Config")
    if getattr(config, "is_encoder_decoder", False) and getattr(config, "decoder_start_token_id", None) is None:
        raise ValueError(
            f"{name} is an encoder-decoder whose config has no decoder_start_token_id: {where} trains it on "
            f"labels, from which transformers makes the decoder's inputs by shifting them right behind that "
            f"token. Set it on the config (T5's checkpoints use the pad token: "
            f"config.decoder_start_token_id = config.pad_token_id), or give your own loss_fn that passes "
            f"decoder_input_ids")
    if not is_encoder_only(config):
        return
    raise ValueError(
        f"{name} is a bidirectional encoder: {where} trains transformers decoders (causal LMs: Llama, "
        f"Mistral, GPT-2, ...; or a config with is_decoder=True) and encoder-decoders (T5, BART) on "
        f"next-token prediction, which an encoder would learn by reading the token it predicts. For a "
        f"masked-LM step give your own objective: {where}(model, batch_fn=lambda micro_batch, seq_len: "
        f"(input_ids, labels), loss_fn=lambda model, x, labels: model(input_ids=x, labels=labels).loss) "
        f"with labels -100 outside the masked positions")


__all__ = ["is_encoder_only", "refuse_encoder"]
