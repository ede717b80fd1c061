"""A sliding attention window (Mistral's) shorter than the planned sequence: planned as full causal
attention, as sdpa runs it, and said in a note of its own kind beside the causal one."""
import pytest

import tunekit
from tunekit.core.notes import of_kind

transformers = pytest.importorskip("transformers")


def mistral(window):
    return transformers.MistralConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                      sliding_window=window)


def test_a_window_shorter_than_the_sequence_is_said_to_save_nothing_with_sdpa():
    p = tunekit.plan(mistral(16), "H100 SXM", precision="bf16", micro_batch=1, seq_len=64, verbose=False)
    [window] = of_kind(p.notes, "plan.sliding_window")
    assert str(window) == (
        "sliding_window=16 is planned as attention over full 64 x 64 scores: torch's SDPA and eager attention mask "
        "the window inside the full scores, so with attention 'sdpa' as planned the window saves no time nor "
        "memory; transformers' flash_attention_2 (attention='flash' on a GPU with flash-attn) computes only the "
        "window, which the plan does not model")
    # the attention's own note stays: the mask transformers builds for the window is an explicit one
    [kernel] = of_kind(p.notes, "plan.attention_kernel")
    assert str(kernel).startswith("attention planned as torch's efficient SDPA kernel for bf16, head dim 16, "
                                  "with a mask")


@pytest.mark.parametrize("window", [64, None])
def test_no_note_where_the_window_covers_the_sequence(window):
    p = tunekit.plan(mistral(window), "cpu", micro_batch=1, seq_len=64, verbose=False)
    assert of_kind(p.notes, "plan.sliding_window") == []
