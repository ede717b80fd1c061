"""What every rank needs to build the same model: a plain JSON-able spec. Models layer.

    >>> spec = model_spec(GPT(GPTConfig.preset("cpu-tiny")))   # {"kind": "gpt", "config": {...}}
    >>> model = build_model(spec, seed=0)                     # the same weights on every rank

Three kinds: ``gpt`` (tunekit's GPT from its GPTConfig fields), ``transformers`` (a config's
``to_dict()`` and ``model_type``: ``AutoModelForCausalLM.from_config``) and ``factory``
(``"package.module:function"``, called with ``kwargs``, returning an nn.Module). A live module
of any other kind cannot be rebuilt in another process: ``model_spec`` says to pass a factory.
The command line names its model as a source (`source_spec`): the same specs.
"""
from __future__ import annotations

import dataclasses
import importlib
import os
import sys

import torch

from tunekit.core.extras import missing_extra
from tunekit.models.adapters import is_transformers_model
from tunekit.models.gpt import GPT, PRESETS, GPTConfig

KINDS = ("gpt", "transformers", "factory")


def model_spec(model) -> dict:
    """The spec that rebuilds ``model``'s architecture (not its weights) in a worker."""
    inner = getattr(model, "_orig_mod", model)
    if isinstance(inner, GPT):
        return {"kind": "gpt", "config": dataclasses.asdict(inner.config)}
    if is_transformers_model(inner):
        cfg = inner.config.to_dict()
        return {"kind": "transformers", "model_type": inner.config.model_type, "config": cfg}
    raise ValueError(f"worker processes cannot rebuild a {type(inner).__name__} instance: "
                     "give the Lab an importable factory instead, Lab(model='package.module:function'), "
                     "or pass lab.run(..., model='package.module:function') so every rank builds its own copy")


def factory_spec(factory: str, **kwargs) -> dict:
    """The spec of an importable ``"package.module:function"`` (checked here, before launch)."""
    check_factory(factory)
    return {"kind": "factory", "factory": factory, "kwargs": kwargs}


def source_spec(kind: str, value) -> dict:
    """The spec of a model named on the command line (tunekit.cli.main): ``("preset", name)``,
    ``("transformers", config dict)`` or ``("factory", "package.module:function")``."""
    if kind == "preset":
        return {"kind": "gpt", "config": dataclasses.asdict(GPTConfig.preset(value))}
    if kind == "transformers":
        return {"kind": "transformers", "model_type": value["model_type"], "config": value}
    return factory_spec(value)


def factory_problem(factory: str) -> str | None:
    """Why ``"package.module:function"`` cannot be imported and called from here, or None."""
    module, name = factory.split(":")
    try:
        fn = getattr(importlib.import_module(module), name)
    except ImportError as e:
        missing = getattr(e, "name", None)
        if isinstance(e, ModuleNotFoundError) and missing and (module + ".").startswith(missing + "."):
            return (f"no module {missing!r} on sys.path ({os.pathsep.join(sys.path)}); run from the folder "
                    "that holds it or add that folder to PYTHONPATH")
        return f"importing {module!r} failed ({type(e).__name__}: {e})"
    except AttributeError:
        return f"module {module!r} has no {name!r}"
    if not callable(fn):
        return f"{name!r} in {module!r} is not callable"
    return None


def check_factory(factory) -> None:
    if not isinstance(factory, str) or factory.count(":") != 1:
        raise ValueError(f"a model given by name is a factory 'package.module:function' (an importable function "
                         f"that returns the nn.Module), got {factory!r}; the built-in GPT needs no name, its "
                         f"sizes are presets ({', '.join(PRESETS)}); a transformers model: build it from its "
                         "config and give the module")
    why = factory_problem(factory)
    if why is not None:
        raise ValueError(f"model factory {factory!r}: {why} (every rank imports it, so it must import "
                         "in this interpreter)")


def call_factory(factory: str, **kwargs):
    """What ``"package.module:function"`` returns, called with ``kwargs`` (not checked: see
    `build_model`)."""
    module, name = factory.split(":")
    return getattr(importlib.import_module(module), name)(**kwargs)


def check_model_spec(spec) -> None:
    """Refuse a spec a worker could not build (before anything starts)."""
    if not isinstance(spec, dict) or spec.get("kind") not in KINDS:
        raise ValueError(f"a model spec is a dict with kind one of {KINDS}, got {spec!r}")
    if spec["kind"] == "factory":
        check_factory(spec.get("factory"))
    elif not isinstance(spec.get("config"), dict):
        raise ValueError(f"a {spec['kind']} model spec needs its config as a dict")


def build_model(spec: dict, seed: int = 0) -> torch.nn.Module:
    """The model of ``spec``, initialized from ``seed`` (the same weights on every rank)."""
    check_model_spec(spec)
    torch.manual_seed(seed)
    if spec["kind"] == "gpt":
        return GPT(GPTConfig(**spec["config"]))
    if spec["kind"] == "transformers":
        try:
            from transformers import AutoConfig, AutoModelForCausalLM
        except ModuleNotFoundError as e:
            raise (missing_extra(e, "a transformers model spec") or e) from None

        cfg = {k: v for k, v in spec["config"].items() if k != "model_type"}
        config = AutoConfig.for_model(spec.get("model_type") or spec["config"]["model_type"], **cfg)
        return AutoModelForCausalLM.from_config(config)
    model = call_factory(spec["factory"], **spec.get("kwargs", {}))
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model factory {spec['factory']} returned {type(model).__name__}, "
                        "not an nn.Module")
    return model
