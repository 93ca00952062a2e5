"""Progress lines for long model-level work (quantize, load, save), through tqdm when installed.

Every long loop takes ``progress``: ``None`` (auto: shown when stderr is a terminal
and there are at least :data:`AUTO_MIN_STEPS` steps), ``True`` (always) or ``False``
(never). Shown means a tqdm bar on stderr, redrawn at every step with the step's name,
when tqdm imports; without tqdm, ``True`` prints one plain line per step to stderr and
auto prints nothing (tqdm is optional: nothing here needs it).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

T = TypeVar("T")

# A 7B Llama has 224 linear layers and 291 GGUF tensors; the tiny test models 14-30.
AUTO_MIN_STEPS = 64


def wants_progress(progress: bool | None, steps: int, is_tty: bool) -> bool:
    """Whether to show progress: ``progress`` itself when a bool, else auto (tty and many steps).

    Raises TypeError for a ``progress`` that is neither None nor a bool.
    """
    if progress is None:
        return is_tty and steps >= AUTO_MIN_STEPS
    if not isinstance(progress, bool):
        raise TypeError(f"progress: expected None, True or False, got {progress!r}")
    return progress


def _stderr_is_tty() -> bool:
    isatty = getattr(sys.stderr, "isatty", None)
    try:
        return bool(isatty and isatty())
    except ValueError:  # a closed stream
        return False


class Progress:
    """``step(name)`` once per unit of work, then ``close()`` (or use it as a context manager)."""

    def __init__(self, desc: str, total: int, progress: bool | None, *, unit: str = "layer"):
        self.desc, self.total, self.done = desc, total, 0
        self._bar: Any = None
        self._plain = False
        if not wants_progress(progress, total, _stderr_is_tty()):
            return
        try:
            from tqdm import tqdm
        except ImportError:
            self._plain = progress is True  # auto never prints without tqdm
            return
        self._bar = tqdm(
            total=total, desc=desc, unit=unit, file=sys.stderr, mininterval=0, miniters=1
        )

    def step(self, name: str) -> None:
        """One unit done: ``name`` says which (a layer or tensor name)."""
        self.done += 1
        if self._bar is not None:
            self._bar.set_postfix_str(name, refresh=False)
            self._bar.update(1)
        elif self._plain:
            print(f"{self.desc}: {self.done}/{self.total} {name}", file=sys.stderr, flush=True)

    def close(self) -> None:
        """Finish the bar (a no-op when nothing is shown)."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def track(
    items: Iterable[T], desc: str, progress: bool | None, name: Callable[[T], str] = str
) -> Iterator[T]:
    """Yield ``items``, one :class:`Progress` step (``name(item)``) after each loop body."""
    items = list(items)
    with Progress(desc, len(items), progress) as bar:
        for item in items:
            yield item
            bar.step(name(item))
