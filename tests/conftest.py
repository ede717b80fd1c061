import os
import tempfile

import pytest

# Calibrations are cached per machine; tests must not read or write the user's cache.
os.environ.setdefault("TUNEKIT_CACHE", tempfile.mkdtemp(prefix="tunekit-cache-"))


def pytest_collection_modifyitems(config, items):
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    if has_cuda:
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (run with the device tool)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _fresh_history():
    from tunekit.measure import probe

    probe.clear_history()
    yield
