"""A griffe extension for `make docs` (mkdocs.yml names this file).

The API pages inspect the imported package (tunekit's public names are lazy re-exports). An
inspected attribute, a dataclass field's default say, carries the docstring of its value's type
(`int`, `str`, `dict`): that text documents Python, not tunekit, so it is dropped here.
"""
from __future__ import annotations

import inspect

import griffe


class TypeDocstrings(griffe.Extension):
    def on_attribute_instance(self, *, node, attr, agent, **kwargs) -> None:
        if attr.docstring is None or not isinstance(node, griffe.ObjectNode):
            return
        type_doc = inspect.cleandoc(type(node.obj).__dict__.get("__doc__") or "") if isinstance(
            type(node.obj).__dict__.get("__doc__"), str) else ""
        if type_doc and attr.docstring.value.strip() == type_doc.strip():
            attr.docstring = None
