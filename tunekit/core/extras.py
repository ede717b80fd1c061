"""Which ``pip install 'tunekit[...]'`` brings a missing optional package: every message about one
names its extra (pyproject's ``[project.optional-dependencies]``). Pure: no imports tried here."""
from __future__ import annotations

import contextlib

# top-level import name -> the extra that installs it
EXTRAS = {"transformers": "hf", "accelerate": "hf", "tensorboard": "tensorboard", "mlflow": "mlflow",
          "lightning": "lightning", "pytorch_lightning": "lightning", "ipyexperiments": "experiments",
          "flash_attn": "gpu"}

# extras for working on tunekit itself, not for using it: never suggested to a user
FOR_CONTRIBUTORS = {"dev": "tunekit's own tests", "docs": "building tunekit's documentation"}
# extras that need a CUDA GPU (flash-attn is built for CUDA and runs on sm_80 and newer)
NEEDS_CUDA = {"gpu": (8, 0)}


# An extra installed by a command of its own: ipyexperiments requires the deprecated `pynvml`
# package, whose shim makes `import torch` print a FutureWarning (nvidia-ml-py, a core dependency,
# provides the module it imports), so it goes in without its dependencies, as `make install` does.
OWN_COMMAND = {"experiments": "pip install --no-deps 'ipyexperiments>=0.1.29'"}


def extras_command(extras) -> str:
    """The pip command(s) that install ``extras``: ``pip install 'tunekit[hf,mlflow]'``, then the
    command of an extra that has its own (`OWN_COMMAND`), joined by '; '.

    >>> extras_command(["experiments", "hf", "mlflow"])
    "pip install 'tunekit[hf,mlflow]'; pip install --no-deps 'ipyexperiments>=0.1.29'"
    """
    plain = [e for e in extras if e not in OWN_COMMAND]
    own = [OWN_COMMAND[e] for e in extras if e in OWN_COMMAND]
    return "; ".join(([f"pip install 'tunekit[{','.join(plain)}]'"] if plain else []) + own)


def pip_command(package: str) -> str | None:
    """``pip install 'tunekit[hf]'`` for ``"transformers"``; None for a package no extra brings."""
    extra = EXTRAS.get(package.split(".")[0])
    return None if extra is None else extras_command([extra])


def missing_extra(e: BaseException, needs: str) -> ModuleNotFoundError | None:
    """``e`` (a failed import) as an error that says what needs the package and the pip command
    that installs it; None when ``e`` is not a missing package an extra brings (re-raise ``e``).

    >>> str(missing_extra(ModuleNotFoundError("No module named 'transformers'", name="transformers"),
    ...                   "a transformers config"))
    "a transformers config needs transformers, which is not installed: pip install 'tunekit[hf]'"
    """
    name = (getattr(e, "name", None) or "").split(".")[0]
    command = pip_command(name) if name else None
    if not isinstance(e, ModuleNotFoundError) or command is None:
        return None
    return ModuleNotFoundError(f"{needs} needs {name}, which is not installed: {command}", name=name)


@contextlib.contextmanager
def needs_extra(needs: str):
    """Imports under it that fail for a package an extra brings say what needs it and the pip
    command (`missing_extra`); any other error passes unchanged.

    Example: a notebook's imports, ``with tunekit.core.needs_extra("chapter 16"): from transformers import
    Trainer`` (without transformers: ``ModuleNotFoundError: chapter 16 needs transformers, which is
    not installed: pip install 'tunekit[hf]'``)."""
    try:
        yield
    except ModuleNotFoundError as e:
        raise (missing_extra(e, needs) or e) from None
