"""Fields of a frozen device weight that are made at first use, once, even across threads."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

_LOCK = threading.Lock()  # one for every weight: a field is made once per weight, rarely


def fill_once(obj, names: Sequence[str], make: Callable[[], tuple]) -> tuple:
    """The values of ``obj``'s fields ``names``; if the first is None, ``make()`` gives them all,
    set once under a lock (a second thread waits and sees them). The first name is set last:
    a reader that sees it set sees the others."""
    if getattr(obj, names[0]) is None:
        with _LOCK:
            if getattr(obj, names[0]) is None:
                values = make()
                for name, value in reversed(list(zip(names, values, strict=True))):
                    object.__setattr__(obj, name, value)
    return tuple(getattr(obj, name) for name in names)
