"""Model factories the distributed tests hand to worker processes ("tests.parallel.dist_factories:NAME")."""
import os

from tunekit.models.gpt import GPT, GPTConfig


def tiny_gpt():
    return GPT(GPTConfig(vocab_size=255, n_layer=2, n_head=4, n_embd=64, block_size=32))


def fails_on_rank_1():
    if os.environ.get("RANK") == "1":
        raise RuntimeError("rank 1 was told to fail")
    return tiny_gpt()
