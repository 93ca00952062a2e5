"""fill_once: a frozen weight's lazily made fields, made once even when threads race."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import pytest

from q2gemv.cuda.runtime.once import fill_once


@dataclass(frozen=True)
class _Weight:
    a: object = None
    b: object = None


def test_makes_once_under_racing_threads_and_returns_the_values():
    w, calls, results = _Weight(), [], []

    def make():
        calls.append(1)
        time.sleep(0.05)  # the other threads arrive while this one is making
        return "A", "B"

    threads = [
        threading.Thread(target=lambda: results.append(fill_once(w, ("a", "b"), make)))
        for _ in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1
    assert results == [("A", "B")] * 4
    assert (w.a, w.b) == ("A", "B")


def test_present_fields_are_returned_without_making():
    w = _Weight(a=1, b=2)
    assert fill_once(w, ("a", "b"), lambda: pytest.fail("made again")) == (1, 2)


def _recorded(name):
    """A data descriptor: object.__setattr__ goes through it, so the order of sets is seen."""

    def set_(self, value):
        self.log.append(name)
        self.__dict__[name] = value

    return property(lambda self: self.__dict__.get(name), set_)


class _Recorded:
    a = _recorded("a")
    b = _recorded("b")
    c = _recorded("c")

    def __init__(self):
        self.log = []


def test_the_first_name_is_set_last():
    """A reader that sees the first field set must see the others: it is the flag."""
    w = _Recorded()
    assert fill_once(w, ("a", "b", "c"), lambda: (1, 2, 3)) == (1, 2, 3)
    assert w.log == ["c", "b", "a"]


def test_a_make_with_the_wrong_number_of_values_sets_nothing():
    w = _Weight()
    with pytest.raises(ValueError):
        fill_once(w, ("a", "b"), lambda: (1,))
    assert w.a is None and w.b is None
