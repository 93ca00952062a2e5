"""The one indirection from a host weight to its device-resident form.

Formats know nothing of CUDA: ``Q2Weight.to_device()`` and
``Nvfp4Weight.to_device()`` call :func:`upload`, which calls the uploader
that :mod:`q2gemv.host.device` registers when the package is imported (importing
``q2gemv.formats.*`` always imports ``q2gemv`` first, so it is always set).
"""

from __future__ import annotations

from collections.abc import Callable

_uploader: Callable | None = None


def register_uploader(fn: Callable) -> None:
    """Install ``fn(weight, stream)``, which returns the device-resident form of ``weight``."""
    global _uploader
    _uploader = fn


def upload(weight, stream=0, **options):
    """The device-resident form of host ``weight`` (see :func:`q2gemv.host.device.to_device`)."""
    if _uploader is None:  # only if q2gemv/__init__.py did not run: a broken install
        raise RuntimeError("weight: no device uploader registered (import q2gemv first)")
    return _uploader(weight, stream, **options)
