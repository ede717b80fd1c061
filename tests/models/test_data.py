"""Corpus from stdlib sources (deterministic, cached) and batching."""
import pytest
import torch

from tunekit.models import data
from tunekit.models.data import Batcher, corpus_bytes, get_batch, synthetic_tokens


def test_corpus_is_deterministic_and_cached(tmp_path, monkeypatch):
    cached = corpus_bytes()
    assert corpus_bytes() == cached
    monkeypatch.setenv("TUNEKIT_CACHE", str(tmp_path))
    rebuilt = corpus_bytes()  # built from scratch in an empty cache (it can always be rebuilt)
    assert rebuilt == cached
    assert data.corpus_path().exists() and str(data.corpus_path()).startswith(str(tmp_path))
    assert rebuilt.startswith(b"# ---- ") and b"\ndef " in rebuilt
    assert len(rebuilt) > 1_000_000  # megabytes of text: enough that cpu-tiny cannot memorize it


def test_get_batch_shapes_and_shift():
    tokens = torch.arange(100, dtype=torch.uint8)
    g = torch.Generator().manual_seed(0)
    x, y = get_batch(tokens, 4, 10, generator=g)
    assert x.shape == y.shape == (4, 10) and x.dtype == y.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])
    assert torch.equal(y - x, torch.ones(4, 10, dtype=torch.int64))  # arange: next token = +1
    g2 = torch.Generator().manual_seed(0)
    assert torch.equal(get_batch(tokens, 4, 10, generator=g2)[0], x)  # reproducible


def test_get_batch_rejects_empty():
    with pytest.raises(ValueError):
        get_batch(torch.arange(100), 0, 10)
    with pytest.raises(ValueError):
        get_batch(torch.arange(5), 1, 10)


def test_synthetic_tokens():
    t = synthetic_tokens(1000, vocab_size=256, seed=1)
    assert t.dtype == torch.uint8 and t.numel() == 1000
    assert torch.equal(t, synthetic_tokens(1000, vocab_size=256, seed=1))
    big = synthetic_tokens(1000, vocab_size=50304, seed=1)
    assert big.dtype == torch.int32 and int(big.max()) < 50304 and int(big.max()) > 255


def test_batcher_sources_and_split():
    b = Batcher(b"abcdefghij" * 100, seed=0, val_fraction=0.1)
    assert b.splits["train"].numel() == 900 and b.splits["val"].numel() == 100
    x, y = b.get(3, 8, split="val")
    assert x.shape == (3, 8)
    s = Batcher("synthetic", vocab_size=1000, synthetic_tokens_n=5000)
    assert int(s.get(2, 16)[0].max()) < 1000
    with pytest.raises(ValueError):
        Batcher("wikipedia")
