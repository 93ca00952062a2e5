"""Fused projections: q/k/v as one quantized layer, gate/up as another.

The members' rows stacked into one layer give the separate layers' outputs bit for bit;
each member becomes a stateless :class:`FusedSlice` of that one output. What can be
fused (:data:`FUSABLE`), the layout and the design: docs/models.md#fused-projections.
"""

from __future__ import annotations

import torch

from ..nn.layers import QuantizedLinear

# (fused layer's name, its members in row order), as vLLM names them
FUSABLE: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("qkv_proj", ("q_proj", "k_proj", "v_proj")),
    ("gate_up_proj", ("gate_proj", "up_proj")),
)


class _Shared:
    """What the members of one fused layer share: the layer, their column ranges, the
    last output (eager: ``(x, version, y, members taken)``; None when every member took it)."""

    __slots__ = ("layer", "bounds", "entry")

    def __init__(self, layer: torch.nn.Module, bounds: tuple[tuple[int, int], ...]) -> None:
        self.layer = layer
        self.bounds = bounds
        self.entry = None

    def __getstate__(self):  # a pickled or copied model carries no activation
        return {"layer": self.layer, "bounds": self.bounds, "entry": None}

    def __setstate__(self, state) -> None:
        for key, value in state.items():
            setattr(self, key, value)


def _version(x: torch.Tensor) -> int | None:
    """``x``'s version counter; None for inference tensors, which have none."""
    return None if x.is_inference() else x._version


class FusedSlice(torch.nn.Module):
    """One member of a fused layer (``q_proj`` of ``qkv_proj``): its columns of the fused output.

    ``forward(x)`` returns ``fused(x)[..., start:stop]`` (a view), with the fused layer run
    once per input for all its members: the first member called with ``x`` runs it and
    keeps ``(x, y)``; a member called with the same tensor object (same version counter,
    where it has one) takes its slice of that ``y``; once every member has taken it, it is
    dropped. Any other call (another tensor, ``x`` written in place since, or a member
    asking twice for the same ``x``) runs the fused layer again: the order of the calls
    does not matter and a stale output is never returned. An inference-mode tensor has
    no version counter, so an in-place write to it between the member calls is not seen;
    transformers never writes the hidden states between them.

    Under ``torch.compile`` dynamo traces the same logic (the kept output is a traced
    value, matched by identity; the version counter is not read), so the fused layer is
    one op in the graph and the slot is empty again when the traced forward ends: no
    graph break, no guard that changes from call to call.
    """

    def __init__(self, shared: _Shared, index: int) -> None:
        super().__init__()
        self._shared = shared
        self.index = index

    @property
    def fused(self) -> torch.nn.Module:
        """The fused q2gemv layer this member is a slice of."""
        return self._shared.layer

    @property
    def start(self) -> int:
        return self._shared.bounds[self.index][0]

    @property
    def stop(self) -> int:
        return self._shared.bounds[self.index][1]

    @property
    def in_features(self) -> int:
        return self._shared.layer.k

    @property
    def out_features(self) -> int:
        return self.stop - self.start

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        sh = self._shared
        start, stop = sh.bounds[self.index]
        compiling = torch.compiler.is_compiling()
        version = None if compiling else _version(x)
        e = sh.entry
        if e is not None and e[0] is x and e[1] == version and self.index not in e[3]:
            taken = e[3] | {self.index}
            sh.entry = None if len(taken) == len(sh.bounds) else (x, version, e[2], taken)
            return e[2][..., start:stop]
        y = sh.layer(x)
        sh.entry = (x, version, y, frozenset({self.index}))
        return y[..., start:stop]

    def extra_repr(self) -> str:
        return f"columns {self.start}:{self.stop} of the fused layer (k={self.in_features})"


def why_not_fusable(members: list[torch.nn.Module]) -> str | None:
    """None when ``members`` can be one layer, else the reason (for the report)."""
    first = members[0]
    if not all(type(m) is type(first) and isinstance(m, QuantizedLinear) for m in members):
        return "not all q2gemv layers of one format"
    if len({id(m) for m in members}) != len(members):
        return "a layer serves two members"
    if len({(m.k, m.numerics, getattr(m, "group", None)) for m in members}) != 1:
        return "in_features, numerics or group differ"
    if len({m.bias is None for m in members}) != 1:
        return "some members have a bias and others not"
    return type(first)._fuse_refusal(members)


def fuse_layers(members: list[torch.nn.Module]) -> torch.nn.Module:
    """One q2gemv layer whose rows are ``members``' rows in order (buffers concatenated).

    Works on the meta device too (an empty fused layer of the right shape). The caller
    checks :func:`why_not_fusable` first.
    """
    first = members[0]
    layer = first._empty_rows(sum(m.n for m in members))
    for name in _buffer_names(first):
        layer._buffers[name] = torch.cat([m._buffers[name] for m in members], 0)
    layer._unloaded = any(m._unloaded for m in members)
    return layer


def _buffer_names(layer: torch.nn.Module) -> tuple[str, ...]:
    """The weight buffers of a q2gemv layer, and its bias if it has one."""
    return (*type(layer)._WEIGHT_BUFFERS, *(("bias",) if layer.bias is not None else ()))


def split_layer(layer: torch.nn.Module, start: int, stop: int) -> torch.nn.Module:
    """Rows ``start:stop`` of a q2gemv layer as a layer of their own (views: no copy)."""
    part = layer._empty_rows(stop - start)
    for name in _buffer_names(layer):
        part._buffers[name] = layer._buffers[name][start:stop]
    part._unloaded = layer._unloaded
    return part


def fuse_group(parent: torch.nn.Module, name: str, members: tuple[str, ...]) -> torch.nn.Module:
    """Set ``parent.<name>`` to the fused layer of ``parent.<members>`` and each member to
    a :class:`FusedSlice` of it. Returns the fused layer."""
    layers = [getattr(parent, m) for m in members]
    fused = fuse_layers(layers)
    bounds, row = [], 0
    for m in layers:
        bounds.append((row, row + m.n))
        row += m.n
    shared = _Shared(fused, tuple(bounds))
    setattr(parent, name, fused)
    for i, m in enumerate(members):
        setattr(parent, m, FusedSlice(shared, i))
    return fused


def _owners(model: torch.nn.Module) -> dict[int, int]:
    """id(module) -> how many places hold it (a module shared by two parents counts twice)."""
    count: dict[int, int] = {}
    for _, mod in model.named_modules(remove_duplicate=False):
        count[id(mod)] = count.get(id(mod), 0) + 1
    return count


def fuse_model(model: torch.nn.Module) -> tuple[dict[str, list[str]], dict[str, str]]:
    """Fuse every fusable group of ``model`` (q/k/v, gate/up of one parent) in place.

    Returns ``(fused, kept)``: fused layer name -> the members' qualified names;
    the first member's qualified name -> why a group whose members are all q2gemv layers
    was left separate (NVFP4 global scales that differ, mixed biases...).
    """
    fused: dict[str, list[str]] = {}
    kept: dict[str, str] = {}
    owners = _owners(model)
    for pname, parent in list(model.named_modules()):
        prefix = f"{pname}." if pname else ""
        for name, members in FUSABLE:
            layers = [getattr(parent, m, None) for m in members]
            quantized = [isinstance(m, QuantizedLinear) for m in layers]
            if not any(quantized) or hasattr(parent, name):
                continue
            if not all(quantized):
                left = [m for m, q in zip(members, quantized, strict=True) if not q]
                kept[prefix + members[0]] = f"not q2gemv layers: {', '.join(left)}"
                continue
            why = why_not_fusable(layers)
            if why is None and any(owners.get(id(m), 0) > 1 for m in layers):
                why = "a member is shared with another module"
            if why is not None:
                kept[prefix + members[0]] = why
                continue
            fuse_group(parent, name, members)
            fused[prefix + name] = [prefix + m for m in members]
    return fused, kept


def fused_projections(model: torch.nn.Module) -> list[list[str]]:
    """The qualified member names of every fused layer of ``model``, in row order."""
    out = []
    for name, mod in model.named_modules():
        for fname, members in FUSABLE:
            fl = getattr(mod, fname, None)
            if isinstance(fl, QuantizedLinear) and all(
                isinstance(getattr(mod, m, None), FusedSlice) and getattr(mod, m).fused is fl
                for m in members
            ):
                prefix = f"{name}." if name else ""
                out.append([prefix + m for m in members])
    return out


def fused_parts(model: torch.nn.Module) -> dict[str, list[tuple[str, torch.nn.Module]]]:
    """Fused layer name -> ``(member qualified name, the member's rows as a layer)`` in order
    (for writers that store the members separately; the parts are views, no copy)."""
    out: dict[str, list[tuple[str, torch.nn.Module]]] = {}
    for members in fused_projections(model):
        prefix, _, first = members[0].rpartition(".")
        parent = model.get_submodule(prefix) if prefix else model
        slices = [getattr(parent, m.rpartition(".")[2]) for m in members]
        fused = slices[0].fused
        fname = next(n for n, ms in FUSABLE if ms[0] == first)
        key = f"{prefix}.{fname}" if prefix else fname
        out[key] = [
            (m, split_layer(fused, s.start, s.stop)) for m, s in zip(members, slices, strict=True)
        ]
    return out


def check_fused_entry(entry) -> tuple[str, str, tuple[str, ...]]:
    """A ``fused_projections`` entry -> (parent name, fused layer name, member attributes).

    ValueError naming the entry when it is not a list of one parent's members of a
    :data:`FUSABLE` group, in order.
    """
    if isinstance(entry, (list, tuple)) and all(isinstance(s, str) for s in entry) and entry:
        parents = {s.rpartition(".")[0] for s in entry}
        attrs = tuple(s.rpartition(".")[2] for s in entry)
        for name, members in FUSABLE:
            if attrs == members and len(parents) == 1:
                return parents.pop(), name, members
    groups = " or ".join(str(list(m)) for _, m in FUSABLE)
    raise ValueError(
        f"quantization_config: fused_projections entry {entry!r} is not the qualified names "
        f"of one module's {groups}, in that order"
    )


def fuse_loaded(model: torch.nn.Module, source: str, fuse: bool) -> None:
    """The loaders' fusion step: :func:`fuse_model` when ``fuse``, and one ``UserWarning``
    naming the groups left separate (e.g. NVFP4 shards whose global scales differ)."""
    if not fuse:
        return
    _, kept = fuse_model(model)
    if kept:
        import warnings

        shown = "; ".join(f"{name}: {why}" for name, why in list(kept.items())[:8])
        warnings.warn(
            f"{source}: {len(kept)} projection group(s) kept as separate layers ({shown})",
            UserWarning,
            stacklevel=3,
        )
