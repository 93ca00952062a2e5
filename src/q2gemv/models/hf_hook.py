"""Register q2gemv with transformers when transformers loads its quantizers, not before.

``import q2gemv.torch`` must stay free of transformers (importing it takes seconds), yet
``AutoModelForCausalLM.from_pretrained`` of a saved q2gemv model must find the
``"q2gemv"`` quantizer whatever the import order. :func:`register_when_transformers_loads`
does it with a post-import hook: if ``transformers.quantizers.auto`` is already imported,
:mod:`q2gemv.models.hf` is imported (which registers) at once; otherwise a finder on
``sys.meta_path`` waits for that module and imports :mod:`q2gemv.models.hf` right after
it has run. A failure there is a ``RuntimeWarning``, never a failed transformers import.
"""

from __future__ import annotations

import importlib
import importlib.abc
import sys
import warnings

TARGET = "transformers.quantizers.auto"


def _register() -> None:
    try:
        importlib.import_module("q2gemv.models.hf")
    except Exception as err:  # transformers too old or changed: from_pretrained will say so
        warnings.warn(
            f"q2gemv could not register its quantizer with transformers: {err!r}",
            RuntimeWarning,
            stacklevel=2,
        )


class _Loader(importlib.abc.Loader):
    """The real loader of ``TARGET``, then :func:`_register`."""

    def __init__(self, loader) -> None:
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module) -> None:
        module.__loader__ = module.__spec__.loader = self.loader
        self.loader.exec_module(module)
        _register()


class _Finder(importlib.abc.MetaPathFinder):
    """Finds ``TARGET`` with the other finders and wraps its loader; removes itself."""

    def find_spec(self, name, path, target=None):
        if name != TARGET:
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(name, path, target) if find else None
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _Loader(spec.loader)
                return spec
        return None


def register_when_transformers_loads() -> None:
    """Register now if transformers' quantizers are imported, else when they are (once)."""
    if TARGET in sys.modules:
        _register()
    elif not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
