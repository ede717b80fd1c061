"""Every pytest run: tunekit's data folder is a temporary one. Notebook runs (pytest --nbval-lax
notebooks/*.ipynb): a cell that writes to stderr fails.

nbval-lax checks that cells run, not what they show; a warning box (a deprecation, a UserWarning
for an expected condition such as "no NVML" on a CPU) would still reach every reader. Expected
conditions belong in a neutral printed note instead.
"""
import atexit
import os
import shutil
import tempfile

import pytest

# Run logs, traces and charts of tests and notebook runs go to a folder of this session, not to
# the developer's own (core.paths.data_dir); kernels and subprocesses inherit it.
if "TUNEKIT_DATA_DIR" not in os.environ:
    os.environ["TUNEKIT_DATA_DIR"] = tempfile.mkdtemp(prefix="tunekit-data-")
    atexit.register(shutil.rmtree, os.environ["TUNEKIT_DATA_DIR"], True)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    outcome = yield
    outputs = getattr(item, "test_outputs", None)   # set by nbval for each executed cell
    if outcome.excinfo is not None or not outputs:
        return
    stderr = [o.get("text", "") for o in outputs
              if o.get("output_type") == "stream" and o.get("name") == "stderr"]
    if stderr:
        raise AssertionError(f"{item.name} wrote to stderr (a warning box in the notebook):\n"
                             + "".join(stderr)[:2000])
