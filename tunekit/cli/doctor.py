"""``tunekit doctor``: is this machine ready for a workshop? One line per check, what to fix after it.

    $ tunekit doctor
    OK   python: 3.11.7
    OK   torch: 2.5.1+cu124, CUDA 12.4, driver 550.54.15, 1 GPU(s): NVIDIA H100 80GB HBM3
    WARN flash-attn: not installed (attention='flash' falls back to torch SDPA)
         fix: pip install 'tunekit[gpu]'
    ...
    doctor: 9 OK, 1 WARN, 0 FAIL

Checks: Python, torch and its CUDA (the driver through NVML), bf16 and flash attention, ipywidgets
and the frontend packages that draw its widgets (jupyterlab_widgets for JupyterLab 4 and Notebook 7,
widgetsnbextension for the classic notebook), plotly and its renderer, tunekit's extras, write
access to the data and cache folders (`core.paths`), a Slurm client. Nothing is fetched from the
network and no GPU work is started, so it takes about as long as importing torch. Exit status 1
when a check FAILs (tunekit cannot work here as it is), else 0; a WARN is a feature that will not
work (flash attention, the widgets in some frontend) with what to do about it.

Each probe is a function of this module returning one `Check`; tests replace the small readers
they call (`_version`, `_extras`, `_which`, `_cuda`, `_nvml`) to play a broken machine.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tunekit.core.extras import EXTRAS, FOR_CONTRIBUTORS, NEEDS_CUDA, extras_command

OK, WARN, FAIL = "OK", "WARN", "FAIL"
MIN_PYTHON = (3, 10)      # pyproject's requires-python
MIN_TORCH = (2, 4)        # pyproject's torch>=2.4
# ipywidgets major -> the jupyterlab_widgets / widgetsnbextension majors that draw its widgets
FRONTENDS = {8: (3, 4), 7: (1, 3)}


@dataclass(frozen=True)
class Check:
    """One checked thing: ``status`` OK/WARN/FAIL, what was found, and what to do (``fix``)."""
    status: str
    name: str
    found: str
    fix: str = ""

    def lines(self) -> list[str]:
        return [f"{self.status:<4} {self.name}: {self.found}"] + ([f"     fix: {self.fix}"] if self.fix else [])


# --- readers (replaced in tests) ----------------------------------------------------------------


def _version(dist: str) -> str | None:
    """The installed version of a distribution, None when it is not installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def _spec(module: str) -> bool:
    """Whether a module can be imported (found, not imported)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _which(program: str) -> str | None:
    return shutil.which(program)


def _cuda() -> dict:
    """What torch says about CUDA: {"cuda": version or None, "gpus": [names], "bf16": bool,
    "capability": (major, minor) of GPU 0 or None}. Starts no kernel."""
    import torch

    if not torch.cuda.is_available():
        return {"cuda": torch.version.cuda, "gpus": [], "bf16": False, "capability": None}
    n = torch.cuda.device_count()
    return {"cuda": torch.version.cuda, "gpus": [torch.cuda.get_device_name(i) for i in range(n)],
            "bf16": torch.cuda.is_bf16_supported(), "capability": torch.cuda.get_device_capability(0)}


def _cpu_flags() -> set | None:
    """The CPU's feature flags as Linux lists them (/proc/cpuinfo); None where it does not."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    return {flag for line in text.splitlines() if line.startswith("flags") for flag in line.split(":", 1)[1].split()}


def _nvml() -> dict | None:
    """The NVIDIA driver as NVML sees it: {"driver": version, "gpus": count}; None without one."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:   # noqa: BLE001 - no library, no driver, no device: all "no driver"
        return None
    try:
        driver = pynvml.nvmlSystemGetDriverVersion()
        return {"driver": driver.decode() if isinstance(driver, bytes) else str(driver),
                "gpus": pynvml.nvmlDeviceGetCount()}
    finally:
        pynvml.nvmlShutdown()


def _major_minor(v: str) -> tuple[int, int]:
    parts = (v.split("+")[0].split(".") + ["0"])[:2]
    return tuple(int("".join(ch for ch in p if ch.isdigit()) or 0) for p in parts)


# --- the checks ---------------------------------------------------------------------------------


def check_python() -> Check:
    v = sys.version_info
    found = f"{v[0]}.{v[1]}.{v[2]}"
    if tuple(v[:2]) < MIN_PYTHON:
        return Check(FAIL, "python", f"{found} (tunekit needs >= {MIN_PYTHON[0]}.{MIN_PYTHON[1]})",
                     "use a newer Python (conda create -n tunekit python=3.11, or uv venv -p 3.11)")
    return Check(OK, "python", found)


def check_torch() -> Check:
    v = _version("torch")
    if v is None:
        return Check(FAIL, "torch", "not installed", "pip install torch (a CUDA build on a GPU machine)")
    if _major_minor(v) < MIN_TORCH:
        return Check(FAIL, "torch", f"{v} (tunekit needs >= {MIN_TORCH[0]}.{MIN_TORCH[1]})", "pip install -U torch")
    cuda, nvml = _cuda(), _nvml()
    driver = f", driver {nvml['driver']}" if nvml else ""
    if cuda["gpus"]:
        names = sorted(set(cuda["gpus"]))
        return Check(OK, "torch", f"{v}, CUDA {cuda['cuda']}{driver}, {len(cuda['gpus'])} GPU(s): {', '.join(names)}")
    hidden = os.environ.get("CUDA_VISIBLE_DEVICES")
    if nvml and nvml["gpus"] and hidden is not None:
        return Check(WARN, "torch", f"{v} sees no GPU: CUDA_VISIBLE_DEVICES={hidden!r} hides the driver's "
                     f"{nvml['gpus']}", "unset CUDA_VISIBLE_DEVICES (or name the GPUs to use)")
    if nvml and nvml["gpus"]:
        why = ("a CPU-only build" if cuda["cuda"] is None
               else f"built for CUDA {cuda['cuda']}, which this driver cannot run")
        return Check(FAIL, "torch", f"{v} sees no GPU, yet the NVIDIA driver {nvml['driver']} has "
                     f"{nvml['gpus']} ({why})",
                     "install the torch build for this driver's CUDA (pytorch.org's install selector), "
                     "and check nvidia-smi")
    return Check(OK, "torch", f"{v}, no GPU: the Lab runs on the CPU")


def check_bf16() -> Check:
    if _version("torch") is None:
        return Check(WARN, "bf16", "unknown (no torch)")
    cuda = _cuda()
    if not cuda["gpus"]:
        flags = _cpu_flags()
        native = sorted({"avx512_bf16", "amx_bf16"} & (flags or set()))
        if flags is None:
            return Check(OK, "bf16", "on the CPU bf16 runs; it is fast only with AVX512-BF16/AMX (this CPU's "
                                     "flags are unknown: no /proc/cpuinfo)")
        if native:
            return Check(OK, "bf16", f"on the CPU bf16 runs natively: this CPU has {' and '.join(native)}")
        return Check(OK, "bf16", "on the CPU bf16 runs, emulated: this CPU has neither AVX512-BF16 nor AMX, "
                                 "so bf16 steps are usually slower than fp32 here")
    if cuda["bf16"]:
        return Check(OK, "bf16", f"supported by {cuda['gpus'][0]}")
    return Check(WARN, "bf16", f"not supported by {cuda['gpus'][0]} (before Ampere): precision "
                 "bf16 is refused", "use precision='fp16' (with its loss scaler) on this GPU")


def check_flash() -> Check:
    installed = _version("flash-attn") or _version("flash_attn")
    if _version("torch") is None:
        return Check(WARN, "flash-attn", "unknown (no torch)")
    cuda = _cuda()
    if not cuda["gpus"]:
        return Check(OK, "flash-attn", ("installed, " if installed else "") +
                     "needs a CUDA GPU: attention='flash' is refused here, 'sdpa' is the fast one")
    cap = cuda["capability"]
    if cap is not None and cap < (8, 0):
        return Check(WARN, "flash-attn", f"{cuda['gpus'][0]} (sm_{cap[0]}{cap[1]}) is older than Ampere: "
                     "flash-attn 2 does not run on it", "use attention='sdpa'")
    if installed:
        return Check(OK, "flash-attn", installed)
    return Check(WARN, "flash-attn", "not installed (attention='flash' falls back to torch SDPA)",
                 "pip install 'tunekit[gpu]'")


def check_widgets() -> Check:
    """ipywidgets and the frontend packages that draw its widgets: in JupyterLab 4 and Notebook 7
    jupyterlab_widgets, in the classic notebook widgetsnbextension. A frontend run from another
    environment needs them there (this checks the kernel's)."""
    v = _version("ipywidgets")
    if v is None:
        return Check(FAIL, "ipywidgets", "not installed: the dashboard cannot show", "pip install 'ipywidgets>=8'")
    major = _major_minor(v)[0]
    lab, classic = _version("jupyterlab_widgets"), _version("widgetsnbextension")
    found = f"{v}, jupyterlab_widgets {lab or 'missing'}, widgetsnbextension {classic or 'missing'}"
    want = FRONTENDS.get(major)
    if want is None:
        return Check(WARN, "ipywidgets", f"{found}: tunekit is tested with ipywidgets 8",
                     "pip install 'ipywidgets>=8,<9'")
    wrong = [f"{name} {have} (ipywidgets {major} needs {need}.x)"
             for name, have, need in (("jupyterlab_widgets", lab, want[0]), ("widgetsnbextension", classic, want[1]))
             if have is not None and _major_minor(have)[0] != need]
    if wrong:
        return Check(FAIL, "ipywidgets", f"{found}: " + ", ".join(wrong) + " shows 'Error displaying widget'",
                     f"pip install 'ipywidgets=={v}' --force-reinstall (brings the matching frontends)")
    if lab is None:
        return Check(WARN, "ipywidgets", f"{found}: JupyterLab 4 and Notebook 7 here draw no widget "
                     "(fine if your Jupyter server runs from another environment that has it)",
                     f"pip install 'jupyterlab_widgets>={want[0]},<{want[0] + 1}'")
    return Check(OK, "ipywidgets", found)


def check_plotly() -> Check:
    v = _version("plotly")
    if v is None:
        return Check(FAIL, "plotly", "not installed: no charts", "pip install 'plotly>=5'")
    if _major_minor(v) < (5, 0):
        return Check(FAIL, "plotly", f"{v} (tunekit needs >= 5)", "pip install -U plotly")
    chosen = os.environ.get("PLOTLY_RENDERER")   # read without importing plotly (half a second)
    renderer = (f"renderer {chosen!r} from $PLOTLY_RENDERER" if chosen else
                "in a notebook plotly's mimetype (JupyterLab 4, Notebook 7 and VS Code draw it; "
                "%load_ext tunekit adds an SVG), outside one tunekit's charts go to HTML files")
    return Check(OK, "plotly", f"{v}, {renderer}")


def _extras() -> dict[str, list[str]]:
    """extra -> the distributions it brings: tunekit's installed metadata (pyproject's
    ``[project.optional-dependencies]``); where tunekit runs from a checkout that was never
    installed, `core.extras.EXTRAS` (import names, which are the distributions' names there)."""
    from importlib.metadata import PackageNotFoundError, requires

    try:
        reqs = requires("tunekit") or []
    except PackageNotFoundError:
        reqs = []
    out: dict[str, list[str]] = {}
    for r in reqs:
        extra = re.search(r"""extra\s*==\s*['"]([^'"]+)['"]""", r)
        if extra:
            out.setdefault(extra.group(1), []).append(re.match(r"[A-Za-z0-9_.\-]+", r).group(0))
    if not out:
        for module, extra in EXTRAS.items():
            if module != "pytorch_lightning":   # lightning's old name: `lightning` says it
                out.setdefault(extra, []).append(module)
    return out


def _unusable(extra: str, cuda: dict | None) -> str | None:
    """Why ``extra`` is of no use on this machine (``cuda``: `_cuda`'s answer, None without
    torch), or None when it is: a CUDA extra without a GPU new enough, a contributor's extra."""
    if extra in FOR_CONTRIBUTORS:
        return f"for {FOR_CONTRIBUTORS[extra]}"
    if extra in NEEDS_CUDA:
        if not cuda or not cuda["gpus"]:
            return "needs a CUDA GPU, this machine has none" if cuda else "needs torch with CUDA"
        need, cap = NEEDS_CUDA[extra], cuda["capability"]
        if cap is not None and cap < need:
            return f"needs sm_{need[0]}{need[1]} or newer, {cuda['gpus'][0]} is sm_{cap[0]}{cap[1]}"
    return None


def check_extras() -> Check:
    """Which of tunekit's extras are installed (every distribution of the extra is); the fix
    names only the missing ones usable here, the others say why they are not suggested."""
    extras = _extras()
    have = sorted(e for e, dists in extras.items() if all(_version(d) for d in dists))
    missing = sorted(set(extras) - set(have))
    cuda = _cuda() if _version("torch") else None
    why = {e: _unusable(e, cuda) for e in missing}
    found = (f"installed: {', '.join(have) or 'none'}; not installed: "
             + (", ".join(e + (f" ({why[e]})" if why[e] else "") for e in missing) or "none"))
    useful = [e for e in missing if why[e] is None]
    fix = f"only if you need them: {extras_command(useful)}" if useful else ""
    return Check(OK, "extras", found, fix)


def check_folders() -> Check:
    """Write access to tunekit's data and cache folders (created when missing, as tunekit would)."""
    from tunekit.core.paths import cache_dir, data_dir

    bad = []
    for env, folder in (("TUNEKIT_DATA_DIR", data_dir()), ("TUNEKIT_CACHE", cache_dir())):
        try:
            folder.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=folder, prefix=".doctor-"):
                pass
        except OSError as e:
            bad.append((env, folder, e.strerror or type(e).__name__))
    if bad:
        return Check(FAIL, "folders", "; ".join(f"{f} is not writable ({why})" for _, f, why in bad),
                     " and ".join(f"export {env}=a/writable/folder" for env, _, _ in bad))
    return Check(OK, "folders", f"{data_dir()} and {cache_dir()} are writable")


def check_slurm() -> Check:
    sbatch = _which("sbatch")
    if sbatch is None:
        return Check(OK, "slurm", "no Slurm client (needed only for tunekit run --slurm and lab.run(on=Slurm(...)))")
    try:
        out = subprocess.run([sbatch, "--version"], capture_output=True, text=True, timeout=2).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        out = ""
    return Check(OK, "slurm", f"{out or 'sbatch'} at {sbatch}" + ("" if _which("squeue") else "; no squeue"))


PROBES = (check_python, check_torch, check_bf16, check_flash, check_widgets, check_plotly, check_extras,
          check_folders, check_slurm)


def run_checks(probes=None) -> list[Check]:
    """Every probe's Check (``probes``: None for `PROBES`); a probe that raises is a FAIL line
    naming the error, not a traceback."""
    out = []
    for probe in PROBES if probes is None else probes:
        try:
            out.append(probe())
        except Exception as e:  # noqa: BLE001 - a broken install is what the doctor is for
            name = probe.__name__.removeprefix("check_")
            out.append(Check(FAIL, name, f"the check raised {type(e).__name__}: {e}",
                             "reinstall the package it names"))
    return out


def report(checks: list[Check]) -> str:
    counts = {s: sum(c.status == s for c in checks) for s in (OK, WARN, FAIL)}
    lines = [line for c in checks for line in c.lines()]
    return "\n".join(lines + [f"doctor: {counts[OK]} OK, {counts[WARN]} WARN, {counts[FAIL]} FAIL"])


def doctor_parser(parser_class=argparse.ArgumentParser, formatter_class=argparse.HelpFormatter):
    return parser_class(prog="tunekit doctor", formatter_class=formatter_class, add_help=False,
                        description="Check this machine for tunekit in one command: Python, torch, CUDA "
                                    "and the driver, bf16, flash-attn, ipywidgets and its frontends, plotly, "
                                    "the extras, the data folders, Slurm. Exit 1 when a check FAILs.")


def doctor_main(_args=None) -> int:
    checks = run_checks()
    print(report(checks))
    return 1 if any(c.status == FAIL for c in checks) else 0


if __name__ == "__main__":
    sys.exit(doctor_main())
