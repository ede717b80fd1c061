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


# --- a real IPython shell with the extension loaded (magics tests) -------------------------------


@pytest.fixture
def ip():
    """The process-wide InteractiveShell with `%load_ext tunekit` and a small model in its namespace."""
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "tunekit")
    shell.run_cell("import torch, numpy as np\nmodel = torch.nn.Linear(128, 128, bias=False)\nbatch_size = 8")
    yield shell
    shell.run_cell("%gpuprofile off")
    shell.run_line_magic("unload_ext", "tunekit")


@pytest.fixture
def run(ip):
    """`run(src)`: run a cell in `ip` as a notebook would (stored in history); returns the ExecutionResult."""

    def run_cell(src):
        return ip.run_cell(src, store_history=True)

    return run_cell
