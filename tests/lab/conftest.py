"""Fixtures the Lab's tests share."""
import pytest


@pytest.fixture
def lab(make_lab):
    """A fresh cpu-tiny Lab of 4 x 64 (small shapes keep each step at a few ms on 2 cores; a given
    peak skips MAMF calibration), its log in tmp_path: the Lab behind the `dash` fixture."""
    return make_lab(peak_tflops=1.0, micro_batch=4, seq_len=64)
