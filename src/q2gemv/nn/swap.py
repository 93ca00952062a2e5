"""Validate every ``torch.nn.Linear`` of a module, then swap them all (or none).

One implementation for :func:`q2gemv.torch.replace_linears` and
:func:`q2gemv.torch.quantize_model`:

1. :func:`find_linears` walks the module once (duplicates included), groups the
   places of each distinct Linear (a Linear shared by two parents is one target with
   two names, replaced in both places by the same new module) and sets aside the
   Linears that cannot be swapped, with the reason:

   * its parent reads the child's ``.weight`` itself instead of calling it
     (``torch.nn.MultiheadAttention`` reads ``out_proj.weight``; the fast path of
     ``torch.nn.TransformerEncoderLayer`` / ``TransformerEncoder`` reads
     ``linear1.weight`` and ``linear2.weight``): a swapped layer there would break
     the forward;
   * ``skip(name, linear)`` returns a reason (the caller's rules: a name, a shape).

2. :func:`swap_linears` builds every replacement first; the first failure raises the
   same exception type with the layer's name in front, and nothing has been swapped.
   Only then is each replacement set on its parent(s).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

# Parents whose forward reads a child Linear's ``.weight`` / ``.bias`` directly.
WEIGHT_READING_PARENTS: tuple[type[torch.nn.Module], ...] = (
    torch.nn.MultiheadAttention,
    torch.nn.TransformerEncoderLayer,
)


@dataclass(frozen=True)
class LinearTarget:
    """One distinct ``torch.nn.Linear`` and every ``(qualified name, parent, attribute)`` place."""

    linear: torch.nn.Linear
    places: tuple[tuple[str, torch.nn.Module, str], ...]

    @property
    def name(self) -> str:
        """The first qualified name (``named_modules`` order)."""
        return self.places[0][0]

    @property
    def names(self) -> tuple[str, ...]:
        """Every qualified name of the Linear (more than one when it is shared)."""
        return tuple(p[0] for p in self.places)


def _parent_reason(parent: torch.nn.Module, attr: str) -> str | None:
    if isinstance(parent, WEIGHT_READING_PARENTS):
        return (
            f"its parent {type(parent).__name__} reads {attr}.weight directly (a swapped "
            "layer has no .weight)"
        )
    return None


def find_linears(
    module: torch.nn.Module,
    skip: Callable[[str, torch.nn.Linear], str | None] | None = None,
) -> tuple[list[LinearTarget], dict[str, str]]:
    """The swappable Linears of ``module`` and the skipped ones.

    Args:
        module: any torch module; ``module`` itself is never a target.
        skip: optional ``skip(qualified_name, linear) -> reason or None``, asked once
            per name of each Linear (a Linear is skipped if any of its names is).

    Returns ``(targets, skipped)``: targets in ``named_modules`` order; ``skipped``
    maps every qualified name of a skipped Linear to the reason.
    """
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"module: expected a torch.nn.Module, got {type(module).__name__}")
    places: dict[int, list[tuple[str, torch.nn.Module, str]]] = {}
    linears: dict[int, torch.nn.Linear] = {}
    for name, child in module.named_modules(remove_duplicate=False):
        if not name or not isinstance(child, torch.nn.Linear):
            continue
        parent_name, _, attr = name.rpartition(".")
        parent = module.get_submodule(parent_name) if parent_name else module
        places.setdefault(id(child), []).append((name, parent, attr))
        linears[id(child)] = child
    targets: list[LinearTarget] = []
    skipped: dict[str, str] = {}
    for key, where in places.items():
        linear = linears[key]
        reason = None
        for name, parent, attr in where:
            reason = _parent_reason(parent, attr) or (skip(name, linear) if skip else None)
            if reason:
                break
        if reason:
            for name, _, _ in where:
                skipped[name] = reason
        else:
            targets.append(LinearTarget(linear, tuple(where)))
    return targets, skipped


def _named(err: Exception, name: str) -> Exception:
    """``err`` again, with the layer's name in front (same type when it can be rebuilt)."""
    msg = f"layer {name!r}: {err}"
    try:
        new = type(err)(msg)
    except Exception:  # an exception type with another constructor
        new = RuntimeError(msg)
    new.__cause__ = err
    return new


def swap_linears(
    targets: list[LinearTarget], make: Callable[[torch.nn.Linear], torch.nn.Module]
) -> dict[str, torch.nn.Module]:
    """Build ``make(linear)`` for every target, then set each on its parent(s).

    A failure while building raises (the exception's type, message prefixed with
    ``layer '<name>': ``) before anything is swapped. Returns ``{qualified name: new
    module}``, every name of a shared Linear included.
    """
    built = []
    for t in targets:
        try:
            new = make(t.linear)
        except Exception as err:
            raise _named(err, t.name) from err
        if not isinstance(new, torch.nn.Module):
            raise TypeError(
                f"make: expected a torch.nn.Module for layer {t.name!r}, got {type(new).__name__}"
            )
        built.append(new)
    done: dict[str, torch.nn.Module] = {}
    for t, new in zip(targets, built, strict=True):
        for name, parent, attr in t.places:
            setattr(parent, attr, new)
            done[name] = new
    return done
