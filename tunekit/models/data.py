"""Training text with no download: the Python standard library's own source files, as bytes.

    >>> from tunekit.models.data import Batcher
    >>> batcher = Batcher("corpus", device="cpu", seed=0)
    >>> x, y = batcher.get(batch_size=8, seq_len=128)   # (8, 128) int64 each; y is x shifted by 1

The corpus is built once from the running interpreter's ``Lib/*.py`` (sorted, so the same
interpreter always gives the same bytes) and cached in ``core.paths.cache_dir()``. ``"synthetic"``
gives uniform random tokens: right for throughput work, useless for learning (loss stays ~ln(vocab)).
"""

from __future__ import annotations

import os
import stat
import sys
import sysconfig
import tempfile
import warnings
from pathlib import Path

import torch

from tunekit.core.paths import cache_dir

_CORPUS_VERSION = 1  # bump when the recipe below changes, so stale caches are not reused


def _stdlib_sources() -> list[Path]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    return sorted(stdlib.glob("*.py"), key=lambda p: p.name)


def corpus_path() -> Path:
    ver = f"py{sys.version_info.major}{sys.version_info.minor}"
    return cache_dir() / f"stdlib-corpus-{ver}-v{_CORPUS_VERSION}.bin"


def corpus_bytes() -> bytes:
    """The byte corpus (a few MB of Python source), built at first use and then read from cache.

    Example: ``len(corpus_bytes())`` is about 4.7e6 on CPython 3.11.
    """
    path = corpus_path()
    notes = []
    if os.path.lexists(path):
        blob = _cached(path)
        if blob.startswith(b"# ---- ") and blob.endswith(b"\n\n"):  # as the recipe below writes it
            return blob
        notes.append("was not a corpus tunekit wrote: built again from the standard library")
    parts = []
    for src in _stdlib_sources():
        text = src.read_bytes()
        parts.append(b"# ---- " + src.name.encode() + b" ----\n" + text.rstrip(b"\n") + b"\n\n")
    blob = b"".join(parts)
    if not blob:
        raise RuntimeError(f"no standard-library sources found under {sysconfig.get_paths()['stdlib']}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # write-then-rename, so a concurrent reader never sees half a file
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(blob)
            os.replace(tmp, path)
        except OSError:
            os.unlink(tmp)
            raise
    except OSError as e:  # a read-only folder, or a directory where the file goes: train on it anyway
        notes.append(f"cannot be written ({e.strerror or e}): the corpus is built again next time")
    if notes:
        warnings.warn(f"tunekit: the corpus cache {path} " + "; it ".join(notes), stacklevel=2)
    return blob


def _cached(path: Path) -> bytes:
    """The cached file's bytes; b"" for anything but a readable regular file (a FIFO would block)."""
    try:
        return path.read_bytes() if stat.S_ISREG(path.stat().st_mode) else b""
    except OSError:
        return b""


def synthetic_tokens(n_tokens: int, vocab_size: int = 256, seed: int = 0) -> torch.Tensor:
    """``n_tokens`` uniform random ids in ``[0, vocab_size)``, reproducible from ``seed``."""
    g = torch.Generator().manual_seed(seed)
    dtype = torch.uint8 if vocab_size <= 256 else torch.int32  # stored small, batches are int64
    return torch.randint(0, vocab_size, (n_tokens,), generator=g, dtype=torch.int64).to(dtype)


def get_batch(data: torch.Tensor, batch_size: int, seq_len: int, device="cpu",
              generator: torch.Generator | None = None):
    """Random windows of ``data`` (1-D token tensor): x, y each (B, T) int64 on ``device``.

    Example: ``x, y = get_batch(tokens, 4, 64)``; ``y[:, :-1]`` equals ``x[:, 1:]``.
    """
    if batch_size < 1 or seq_len < 1:
        raise ValueError(f"batch_size and seq_len must be >= 1, got {batch_size}, {seq_len}")
    if data.numel() < seq_len + 1:
        raise ValueError(f"data has {data.numel()} tokens, need more than seq_len={seq_len}")
    starts = torch.randint(0, data.numel() - seq_len, (batch_size, 1), generator=generator)
    windows = data[starts + torch.arange(seq_len + 1)].long()  # (B, T+1)
    x, y = windows[:, :-1].contiguous(), windows[:, 1:].contiguous()  # (B, T) each
    device = torch.device(device)
    if device.type == "cuda":
        # pinned host memory lets the copy overlap with compute
        return (x.pin_memory().to(device, non_blocking=True),
                y.pin_memory().to(device, non_blocking=True))
    return x.to(device), y.to(device)


class Batcher:
    """Draws (x, y) batches from the corpus, synthetic tokens, or your own bytes/tensor.

    ``source``: ``"corpus"`` | ``"synthetic"`` | bytes | 1-D tensor. The last ``val_fraction`` of
    the tokens is held out as the ``"val"`` split. Example: ``Batcher("synthetic").get(2, 16)``.
    """

    def __init__(self, source="corpus", device="cpu", seed: int = 0, val_fraction: float = 0.1,
                 vocab_size: int = 256, synthetic_tokens_n: int = 1 << 20):
        if isinstance(source, str) and source == "corpus":
            tokens = torch.frombuffer(bytearray(corpus_bytes()), dtype=torch.uint8)
        elif isinstance(source, str) and source == "synthetic":
            tokens = synthetic_tokens(synthetic_tokens_n, vocab_size, seed)
        elif isinstance(source, (bytes, bytearray)):
            tokens = torch.frombuffer(bytearray(source), dtype=torch.uint8)
        elif isinstance(source, torch.Tensor):
            tokens = source.flatten()
        else:
            raise ValueError(f"source must be 'corpus', 'synthetic', bytes or a tensor, got {source!r}")
        self.source = source if isinstance(source, str) else type(source).__name__
        self.device = torch.device(device)
        n_val = int(tokens.numel() * val_fraction)
        self.splits = {"train": tokens[: tokens.numel() - n_val], "val": tokens[tokens.numel() - n_val:]}
        self.generator = torch.Generator().manual_seed(seed)

    def get(self, batch_size: int, seq_len: int, split: str = "train"):
        """x, y: (batch_size, seq_len) int64 on the batcher's device."""
        return get_batch(self.splits[split], batch_size, seq_len, self.device, self.generator)

    __call__ = get
