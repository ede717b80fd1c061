"""A bidirectional encoder (BERT) is refused by the Lab and by tunekit.plan of its config before
any work, with what is supported; its causal variant (is_decoder=True) and a Lab given its own
objective go on."""
import warnings

import pytest
import torch

transformers = pytest.importorskip("transformers")

import tunekit  # noqa: E402
from tunekit.models.encoders import is_encoder_only  # noqa: E402


def bert(**kw):
    return transformers.BertConfig(vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                   intermediate_size=128, max_position_embeddings=64, **kw)


def test_which_configs_are_encoders():
    assert is_encoder_only(bert())
    assert not is_encoder_only(bert(is_decoder=True))        # BertLMHeadModel's causal set-up
    assert not is_encoder_only(transformers.LlamaConfig())   # llama has no masked-LM head
    assert not is_encoder_only(transformers.BartConfig())    # an encoder-decoder
    assert not is_encoder_only(object())                     # not a transformers config


def test_plan_of_an_encoder_config_is_refused_before_building_it():
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # nothing built: no transformers warning ("add is_decoder=True")
        with pytest.raises(ValueError) as e:
            tunekit.plan(bert(), "cpu", micro_batch=2, seq_len=32)
    words = str(e.value)
    assert words.startswith("Bert is a bidirectional encoder: tunekit.plan trains transformers decoders")
    assert "loss_fn=" in words and "-100" in words


def test_lab_of_a_masked_lm_is_refused_and_its_own_objective_is_taken():
    torch.manual_seed(0)
    model = transformers.BertForMaskedLM(bert())
    with pytest.raises(ValueError, match="^Bert is a bidirectional encoder: tunekit.Lab trains"):
        tunekit.Lab(model, device="cpu")

    def batch_fn(b, s):   # 15% of the positions masked, the others -100 (not in the loss)
        g = torch.Generator().manual_seed(0)
        x = torch.randint(0, 256, (b, s), generator=g)
        masked = torch.rand(b, s, generator=g) < 0.15
        return x.masked_fill(masked, 0), x.masked_fill(~masked, -100)

    lab = tunekit.Lab(model, device="cpu", batch_fn=batch_fn,
                      loss_fn=lambda m, x, labels: m(input_ids=x, labels=labels).loss)
    assert lab.model is model


def test_an_encoder_decoder_without_a_decoder_start_token_is_refused_before_any_work():
    # a T5Config made from scratch has no decoder_start_token_id: plan and the Lab failed with
    # AttributeError deep inside T5's _shift_right
    t5 = transformers.T5Config(d_model=64, d_ff=128, num_layers=1, num_heads=4, d_kv=16, vocab_size=256)
    with pytest.raises(ValueError, match="^T5 is an encoder-decoder whose config has no decoder_start_token_id: "
                                         "tunekit.plan trains it on labels.*config.decoder_start_token_id = "
                                         "config.pad_token_id"):
        tunekit.plan(t5, "cpu", micro_batch=2, seq_len=16)
    torch.manual_seed(0)
    model = transformers.AutoModelForSeq2SeqLM.from_config(t5)
    with pytest.raises(ValueError, match="^T5 is an encoder-decoder whose config has no decoder_start_token_id: "
                                         "tunekit.Lab"):
        tunekit.Lab(model, device="cpu")
    t5.decoder_start_token_id = t5.pad_token_id   # as the message says: then it is planned
    assert tunekit.plan(t5, "cpu", micro_batch=2, seq_len=16, verbose=False).method == "fake step"


def test_an_encoder_decoder_config_is_not_read_as_one_decoder():
    # estimate_memory(T5Config) read T5 as a 2-layer Llama: half its parameters (the decoder stack
    # and cross-attention missing), "counts may be off"; and MFU took the attention of one causal stack
    from tunekit.core.shapes import model_shape
    from tunekit.models.adapters import adapt

    t5 = transformers.T5Config(d_model=64, d_ff=128, num_layers=2, num_heads=4, d_kv=16, vocab_size=256,
                               decoder_start_token_id=0)
    with pytest.raises(ValueError, match="^T5 is an encoder-decoder: tunekit's shape formulas are a decoder's"):
        model_shape(t5)
    with pytest.raises(ValueError, match="^T5 is an encoder-decoder: .*tunekit.plan\\(config\\)"):
        tunekit.estimate_memory(t5, micro_batch=2, seq_len=16, precision="fp32")
    torch.manual_seed(0)
    model = transformers.AutoModelForSeq2SeqLM.from_config(t5)
    n = sum(p.numel() for p in model.parameters())
    # the built model is counted as it is: weights 4 bytes x every parameter
    assert tunekit.estimate_memory(model, micro_batch=2, seq_len=16, precision="fp32").components["weights"] == 4 * n
    assert adapt(model).shape is None and adapt(model).max_seq_len is None   # MFU from the count, said so
    p = tunekit.plan(t5, "cpu", micro_batch=2, seq_len=16, verbose=False)
    assert p.method == "fake step" and any(n.startswith("MFU from the counted FLOPs") for n in p.notes)
