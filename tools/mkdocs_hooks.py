"""MkDocs hooks for `make docs` (mkdocs.yml names this file).

mkdocstrings inspects the imported tunekit package (its public names are lazy re-exports), and
inspecting ipywidgets' classes touches attributes ipywidgets marks deprecated: those warnings say
nothing about tunekit's docs, so they are silenced here; every other warning still fails the
strict build.
"""
import warnings


def on_startup(command, dirty):
    # raised with the caller's frame (inspect.py), so matched by their words, not their module
    warnings.filterwarnings("ignore", message=r"Widget\.\w+ is deprecated", category=DeprecationWarning)
