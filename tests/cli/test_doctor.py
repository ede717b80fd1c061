"""`tunekit doctor`: one OK/WARN/FAIL line per check and what to fix, exit 1 on a FAIL. The broken
machines are played by replacing the module's readers (`_version`, `_spec`, `_which`, `_cuda`,
`_nvml`); the exact lines are the contract a workshop's instructions quote."""
import subprocess
import sys
from pathlib import Path

import pytest

from tunekit.cli import doctor as d
from tunekit.cli import main as cli

ROOT = Path(__file__).resolve().parents[2]

CPU = {"cuda": None, "gpus": [], "bf16": False, "capability": None}
H100 = {"cuda": "12.4", "gpus": ["NVIDIA H100 80GB HBM3"], "bf16": True, "capability": (9, 0)}
T4 = {"cuda": "12.4", "gpus": ["Tesla T4"], "bf16": False, "capability": (7, 5)}


@pytest.fixture
def machine(monkeypatch):
    """A machine with these distributions installed ({name: version}), this CUDA and this driver."""
    def make(versions, cuda=CPU, nvml=None):
        monkeypatch.setattr(d, "_version", lambda dist: versions.get(dist))
        monkeypatch.setattr(d, "_cuda", lambda: cuda)
        monkeypatch.setattr(d, "_nvml", lambda: nvml)
    return make


GOOD = {"torch": "2.5.1", "ipywidgets": "8.1.5", "jupyterlab_widgets": "3.0.13",
        "widgetsnbextension": "4.0.13", "plotly": "5.24.1"}


def test_the_subcommand_prints_every_check_and_a_count():
    out = subprocess.run([sys.executable, "-m", "tunekit", "doctor"], capture_output=True, text=True, timeout=120)
    lines = out.stdout.splitlines()
    names = [line.split()[1].rstrip(":") for line in lines if line.split()[0] in ("OK", "WARN", "FAIL")]
    assert names == ["python", "torch", "bf16", "flash-attn", "ipywidgets", "plotly", "extras", "folders", "slurm"]
    fails = sum(line.startswith("FAIL") for line in lines)
    assert lines[-1].startswith("doctor: ") and lines[-1].endswith(f", {fails} FAIL")
    assert out.returncode == (1 if fails else 0), out.stdout + out.stderr


def test_the_subcommand_is_listed_in_the_help():
    assert "doctor" in cli.parser().format_help()
    assert cli.parser().parse_args(["doctor"]).command == "doctor"


def test_a_cpu_machine(machine):
    machine(GOOD)
    assert d.check_torch().lines() == ["OK   torch: 2.5.1, no GPU: the Lab runs on the CPU"]
    assert d.check_flash().status == d.OK


@pytest.mark.parametrize("flags, line", [
    ({"avx512f", "avx512_bf16"}, "OK   bf16: on the CPU bf16 runs natively: this CPU has avx512_bf16"),
    ({"avx2", "fma"}, "OK   bf16: on the CPU bf16 runs, emulated: this CPU has neither AVX512-BF16 nor AMX, "
                      "so bf16 steps are usually slower than fp32 here"),
    (None, "OK   bf16: on the CPU bf16 runs; it is fast only with AVX512-BF16/AMX (this CPU's flags are "
           "unknown: no /proc/cpuinfo)")])
def test_on_a_cpu_bf16_says_whether_this_cpu_runs_it_natively(machine, monkeypatch, flags, line):
    machine(GOOD)
    monkeypatch.setattr(d, "_cpu_flags", lambda: flags)
    assert d.check_bf16().lines() == [line]


def test_a_gpu_machine_without_flash_attn_warns(machine):
    machine(GOOD, cuda=H100, nvml={"driver": "550.54.15", "gpus": 1})
    assert d.check_torch().lines() == [
        "OK   torch: 2.5.1, CUDA 12.4, driver 550.54.15, 1 GPU(s): NVIDIA H100 80GB HBM3"]
    assert d.check_bf16().lines() == ["OK   bf16: supported by NVIDIA H100 80GB HBM3"]
    assert d.check_flash().lines() == [
        "WARN flash-attn: not installed (attention='flash' falls back to torch SDPA)",
        "     fix: pip install 'tunekit[gpu]'"]
    machine({**GOOD, "flash-attn": "2.7.0"}, cuda=H100, nvml={"driver": "550.54.15", "gpus": 1})
    assert d.check_flash().lines() == ["OK   flash-attn: 2.7.0"]


def test_a_turing_gpu_has_no_bf16_nor_flash(machine):
    machine(GOOD, cuda=T4, nvml={"driver": "535.1", "gpus": 1})
    assert d.check_bf16().lines() == [
        "WARN bf16: not supported by Tesla T4 (before Ampere): precision bf16 is refused",
        "     fix: use precision='fp16' (with its loss scaler) on this GPU"]
    assert d.check_flash().lines()[0] == ("WARN flash-attn: Tesla T4 (sm_75) is older than Ampere: "
                                          "flash-attn 2 does not run on it")


def test_a_cpu_torch_on_a_gpu_machine_fails(machine, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    machine(GOOD, cuda=CPU, nvml={"driver": "550.54.15", "gpus": 8})
    assert d.check_torch().lines() == [
        "FAIL torch: 2.5.1 sees no GPU, yet the NVIDIA driver 550.54.15 has 8 (a CPU-only build)",
        "     fix: install the torch build for this driver's CUDA (pytorch.org's install selector), "
        "and check nvidia-smi"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")   # hidden on purpose: said, not a failure
    assert d.check_torch().lines() == [
        "WARN torch: 2.5.1 sees no GPU: CUDA_VISIBLE_DEVICES='' hides the driver's 8",
        "     fix: unset CUDA_VISIBLE_DEVICES (or name the GPUs to use)"]


def test_missing_or_old_torch_fails(machine):
    machine({})
    assert d.check_torch().lines() == ["FAIL torch: not installed",
                                       "     fix: pip install torch (a CUDA build on a GPU machine)"]
    machine({"torch": "2.3.1+cu121"})
    assert d.check_torch().lines()[0] == "FAIL torch: 2.3.1+cu121 (tunekit needs >= 2.4)"


def test_widgets_and_their_frontends(machine):
    machine(GOOD)
    assert d.check_widgets().lines() == [
        "OK   ipywidgets: 8.1.5, jupyterlab_widgets 3.0.13, widgetsnbextension 4.0.13"]
    # ipywidgets 8 with the frontend of ipywidgets 7: the classic 'Error displaying widget'
    machine({**GOOD, "jupyterlab_widgets": "1.1.1"})
    assert d.check_widgets().lines() == [
        "FAIL ipywidgets: 8.1.5, jupyterlab_widgets 1.1.1, widgetsnbextension 4.0.13: jupyterlab_widgets "
        "1.1.1 (ipywidgets 8 needs 3.x) shows 'Error displaying widget'",
        "     fix: pip install 'ipywidgets==8.1.5' --force-reinstall (brings the matching frontends)"]
    machine({k: v for k, v in GOOD.items() if k != "jupyterlab_widgets"})
    assert d.check_widgets().lines()[-1] == "     fix: pip install 'jupyterlab_widgets>=3,<4'"
    assert d.check_widgets().status == d.WARN
    machine({k: v for k, v in GOOD.items() if k != "ipywidgets"})
    assert d.check_widgets().lines() == ["FAIL ipywidgets: not installed: the dashboard cannot show",
                                         "     fix: pip install 'ipywidgets>=8'"]


def test_plotly(machine, monkeypatch):
    machine({})
    assert d.check_plotly().lines() == ["FAIL plotly: not installed: no charts", "     fix: pip install 'plotly>=5'"]
    machine({"plotly": "4.14.3"})
    assert d.check_plotly().status == d.FAIL
    machine({"plotly": "5.24.1"})
    monkeypatch.setenv("PLOTLY_RENDERER", "browser")
    assert d.check_plotly().lines() == ["OK   plotly: 5.24.1, renderer 'browser' from $PLOTLY_RENDERER"]
    monkeypatch.delenv("PLOTLY_RENDERER")
    assert d.check_plotly().lines() == [
        "OK   plotly: 5.24.1, in a notebook plotly's mimetype (JupyterLab 4, Notebook 7 and VS Code draw it; "
        "%load_ext tunekit adds an SVG), outside one tunekit's charts go to HTML files"]


def test_extras_name_the_pip_command_for_the_missing_ones(monkeypatch, machine):
    machine({}, cuda=H100)
    monkeypatch.setattr(d, "_extras", lambda: {"hf": ["transformers", "accelerate"], "gpu": ["flash-attn"],
                                              "browser": ["jupyterlab", "notebook"], "mlflow": ["mlflow-skinny"]})
    have = {"torch": "2.5.1", "transformers": "4.48.0", "accelerate": "1.1.0", "mlflow-skinny": "2.10.0",
            "jupyterlab": "4.3.0"}
    monkeypatch.setattr(d, "_version", have.get)
    # browser needs notebook too: an extra counts as installed only when all it brings is
    assert d.check_extras().lines() == [
        "OK   extras: installed: hf, mlflow; not installed: browser, gpu",
        "     fix: only if you need them: pip install 'tunekit[browser,gpu]'"]


@pytest.mark.parametrize("cuda, versions, gpu_why", [
    (CPU, GOOD, "needs a CUDA GPU, this machine has none"),
    (T4, GOOD, "needs sm_80 or newer, Tesla T4 is sm_75"),
    (CPU, {}, "needs torch with CUDA")])
def test_extras_this_machine_cannot_use_are_not_suggested_and_say_why(monkeypatch, machine, cuda, versions, gpu_why):
    # a CPU-only torch was told `pip install 'tunekit[docs,gpu]'`: flash-attn needs a CUDA GPU
    # (sm_80+), docs and dev are for working on tunekit itself
    machine(versions, cuda=cuda)
    monkeypatch.setattr(d, "_extras", lambda: {"gpu": ["flash-attn"], "docs": ["mkdocs"], "dev": ["pytest"],
                                              "mlflow": ["mlflow-skinny"]})
    assert d.check_extras().lines() == [
        "OK   extras: installed: none; not installed: dev (for tunekit's own tests), docs (for building "
        f"tunekit's documentation), gpu ({gpu_why}), mlflow",
        "     fix: only if you need them: pip install 'tunekit[mlflow]'"]
    monkeypatch.setattr(d, "_version", {**versions, "mlflow-skinny": "2.10.0"}.get)
    assert len(d.check_extras().lines()) == 1     # nothing usable is missing: no fix line


def test_the_experiments_extra_is_named_by_the_command_that_keeps_import_torch_quiet(monkeypatch, machine):
    # `pip install 'tunekit[experiments]'` brings the deprecated pynvml package, whose shim makes
    # `import torch` warn: the fix names ipyexperiments without its dependencies, as make install does
    machine({})
    monkeypatch.setattr(d, "_extras", lambda: {"hf": ["transformers"], "experiments": ["ipyexperiments"],
                                              "mlflow": ["mlflow-skinny"]})
    monkeypatch.setattr(d, "_version", {"transformers": "4.48.0"}.get)
    assert d.check_extras().lines() == [
        "OK   extras: installed: hf; not installed: experiments, mlflow",
        "     fix: only if you need them: pip install 'tunekit[mlflow]'; "
        "pip install --no-deps 'ipyexperiments>=0.1.29'"]
    monkeypatch.setattr(d, "_version", {"transformers": "4.48.0", "mlflow-skinny": "2.10.0"}.get)
    fix = d.check_extras().lines()[1]
    assert fix == "     fix: only if you need them: pip install --no-deps 'ipyexperiments>=0.1.29'"


def test_the_extras_are_pyprojects(monkeypatch):
    from importlib.metadata import PackageNotFoundError

    tomllib = pytest.importorskip("tomllib")   # Python 3.11+

    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    try:
        found = d._extras()
    except PackageNotFoundError:
        pytest.skip("tunekit is not installed here")
    # an installed tunekit lists its own extras (an older install may lack one added since)
    assert set(found) <= set(declared) and {"hf", "gpu"} <= set(found)
    assert found["hf"] == ["transformers", "accelerate"]


def test_a_read_only_data_folder_fails(monkeypatch, tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    monkeypatch.setenv("TUNEKIT_DATA_DIR", str(ro / "data"))
    monkeypatch.setenv("TUNEKIT_CACHE", str(tmp_path / "cache"))
    try:
        c = d.check_folders()
        if c.status == d.OK:
            pytest.skip("this user writes into a read-only folder (root)")
        assert c.lines() == [f"FAIL folders: {ro / 'data'} is not writable (Permission denied)",
                             "     fix: export TUNEKIT_DATA_DIR=a/writable/folder"]
    finally:
        ro.chmod(0o700)


def test_a_file_in_place_of_the_folder_fails_even_for_root(monkeypatch, tmp_path):
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("TUNEKIT_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("TUNEKIT_CACHE", str(tmp_path / "file" / "cache"))
    assert d.check_folders().lines() == [
        f"FAIL folders: {tmp_path / 'file' / 'cache'} is not writable (Not a directory)",
        "     fix: export TUNEKIT_CACHE=a/writable/folder"]
    assert (tmp_path / "data").is_dir() and not list((tmp_path / "data").iterdir())   # made, no file left


def test_slurm(monkeypatch):
    monkeypatch.setattr(d, "_which", lambda p: None)
    assert d.check_slurm().lines() == [
        "OK   slurm: no Slurm client (needed only for tunekit run --slurm and lab.run(on=Slurm(...)))"]


def test_a_probe_that_raises_is_a_fail_line_and_exit_1(monkeypatch, capsys):
    def check_torch():
        raise OSError("libcudart.so.12: cannot open shared object file")

    def check_python():
        return d.Check(d.OK, "python", "3.11.7")

    monkeypatch.setattr(d, "PROBES", (check_python, check_torch))
    assert d.doctor_main() == 1
    assert capsys.readouterr().out.splitlines() == [
        "OK   python: 3.11.7",
        "FAIL torch: the check raised OSError: libcudart.so.12: cannot open shared object file",
        "     fix: reinstall the package it names",
        "doctor: 1 OK, 0 WARN, 1 FAIL"]
