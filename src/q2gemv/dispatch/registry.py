"""The kernel registry: one :class:`KernelSpec` per kernel, the one place a kernel's identity lives.

The API's kernel tables, the launch geometry, the builds in :mod:`q2gemv.cuda`, the
golden generator's families, the tier table and the benchmark candidates derive a
kernel from here. Pure data: no numba, no NumPy, no device.

A spec says *what* a kernel is: its family (the weight format) and numerics
contract, its thread map (output rows per 256-thread CTA), how many
activation rows one launch serves, whether it is compiled once per M,
the activation alignment it needs, the width of its weight indexing, the
dotted name of its NumPy reference, the template knobs its build takes, and
the golden family whose vectors cover it. *How* it is built and launched
stays in the family's module (:mod:`q2gemv.cuda.q2_0`, ``.nvfp4``,
``.exact``), which reads the knobs from the spec.

Adding a kernel: :func:`register` a spec (``docs/architecture.md``, "Where
to add things"). Registering at run time (``benchmarks/candidates.py``) is
the same call with ``golden=False``; nothing else is patched.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType

FAMILIES = ("q2_0", "w4a16")
# The torch layers' default format (q2gemv.torch.quantize_model, replace_linears, a
# quantization_config without "format"): a FamilySpec.layer_format.
DEFAULT_LAYER_FORMAT = "q2_0"
CONTRACTS = ("seed", "exact")
THREADS_PER_CTA = 256

# Activation rows per launch of the batched Q2_0 seed kernels (they stage at most this many).
Q2_BATCHM_MAX_M = 8
# q2_0_gemv_exact: activation rows per chunk of a call. A chunk of up to 8 rows is one launch
# of the unbatched build (a 16-row unbatched build runs one CTA per SM: docs/design_notes.md);
# 9..32 rows are one launch of the batched build on wide weights, 8-row launches on narrow
# ones (q2gemv.cuda.q2_0.exact.batched_for, measured). Chunking is free under the exact contract.
Q2_EXACT_MAX_M = 32
# q2_0_gemv_exact: codes per unit (one activation sum each; both groups are whole units), so
# K is a multiple of it.
Q2_EXACT_UNIT = 64
# w4a16_gemv_exact: activation rows per launch: 3 limb columns a row, in up to 3 column tiles
# of 8 (mma.m16n8k16); more rows are chunked (free under the exact contract).
W4_EXACT_MAX_M = 8


@dataclass(frozen=True)
class KernelSpec:
    """What one kernel is (its identity); the family module knows how to build and launch it.

    Attributes:
        name: the kernel's public name (``kernel=`` of :func:`q2gemv.gemv`).
        family: ``"q2_0"`` or ``"w4a16"``: the weight format it reads.
        contract: ``"seed"`` (a documented fp32 order) or ``"exact"`` (the value).
        reference: dotted name of the NumPy function reproducing its bits
            (``"q2gemv.reference.q2_0.q2_0_gemv_vec"``).
        template: which body factory of the family module builds it
            (``"q2_0_gemv"``, ``"q2_0_vec"``, ``"w4a16_batchm"``, ``"q2_0_exact"``, ...).
        rows_per_cta: output rows (columns of y) one 256-thread CTA computes:
            the grid is ``ceil(N / rows_per_cta)``.
        max_m: activation rows one launch serves; more rows are chunked.
        per_m: compiled once per M of a launch (1..max_m), M a compile-time constant.
        a_align: bytes the kernel reads activations at a time (the buffer's
            address must be a multiple; 2 = bf16 by bf16, no requirement).
        index_bits: width of its weight indexing (32: at most 2**32 uint16
            halves of weight; 64: no limit).
        rows_per_warp: register tiling: output rows (columns) one warp computes.
        words: Q2_0 vec template: 32-bit words in flight per lane (None: default).
        depth, a_ahead, unroll_words: W4A16 template knobs (latency hiding
            only; :mod:`q2gemv.cuda.nvfp4`).
        golden: covered by the shipped golden vectors (the generator's
            :func:`golden_family`); False for run-time candidates.
        module: dotted name of the module that builds and launches it; ""
            (the default): its family's ``seed_module`` or ``exact_module``
            (:class:`FamilySpec`, :func:`module_of`). An exact kernel variant
            in its own file names that file here.
        grid_wait: it reads what the launch before it in its call wrote (the
            prepared operands) only after ``grid_dep_wait``
            (:mod:`q2gemv.cuda.runtime.dev`), so a pre-bound call may launch it
            with programmatic dependent launch (it starts while that launch
            still runs). Never set it on a kernel without that wait.
    """

    name: str
    family: str
    contract: str
    reference: str
    template: str
    rows_per_cta: int
    max_m: int
    per_m: bool = False
    a_align: int = 2
    index_bits: int = 32
    rows_per_warp: int = 1
    words: int | None = None
    depth: int = 2
    a_ahead: bool = False
    unroll_words: bool = True
    golden: bool = True
    module: str = ""
    grid_wait: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise ValueError(f"name: expected an identifier, got {self.name!r}")
        if self.family not in FAMILIES:
            raise ValueError(f"family: expected one of {FAMILIES}, got {self.family!r}")
        if self.contract not in CONTRACTS:
            raise ValueError(f"contract: expected one of {CONTRACTS}, got {self.contract!r}")
        if not isinstance(self.reference, str) or "." not in self.reference:
            raise ValueError(f"reference: expected a dotted name, got {self.reference!r}")
        for f in ("rows_per_cta", "max_m", "rows_per_warp", "a_align"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{f}: expected an int >= 1, got {v!r}")
        if self.index_bits not in (32, 64):
            raise ValueError(f"index_bits: expected 32 or 64, got {self.index_bits!r}")

    @property
    def cols(self) -> int:
        """W4A16 name for :attr:`rows_per_warp`: output columns per warp."""
        return self.rows_per_warp

    @property
    def columns_per_cta(self) -> int:
        """Output columns (rows of the weight) per CTA: :attr:`rows_per_cta`."""
        return self.rows_per_cta

    @property
    def golden_family(self) -> str:
        """The golden generator's family: ``family`` for seed kernels, ``family + "_exact"``."""
        return self.family if self.contract == "seed" else f"{self.family}_exact"

    def grid(self, n: int) -> tuple[int, int, int]:
        """Grid for ``n`` output rows; the block is always (256, 1, 1)."""
        if n < 1:
            raise ValueError(f"n: expected >= 1, got {n}")
        return (-(-n // self.rows_per_cta), 1, 1)


_SPECS: dict[str, KernelSpec] = {}
# name -> max_m per (family, contract): live views handed out by table()
_TABLES: dict[tuple[str, str], dict[str, int]] = {(f, c): {} for f in FAMILIES for c in CONTRACTS}
_ROWS_PER_CTA: dict[str, dict[str, int]] = {f: {} for f in FAMILIES}


def register(spec: KernelSpec, *, replace: bool = False) -> KernelSpec:
    """Add ``spec`` to the registry (every table derived from it sees it at once).

    A second spec of one name is a ValueError unless ``replace`` (a candidate
    re-registered with other knobs); the family module's build cache is keyed
    by the spec, so a replaced spec is rebuilt.
    """
    if not isinstance(spec, KernelSpec):
        raise TypeError(f"spec: expected a KernelSpec, got {type(spec).__name__}")
    if spec.name in _SPECS and not replace:
        raise ValueError(f"spec: a kernel named {spec.name!r} is already registered")
    old = _SPECS.get(spec.name)
    if old is not None:
        _TABLES[(old.family, old.contract)].pop(old.name, None)
        _ROWS_PER_CTA[old.family].pop(old.name, None)
    _SPECS[spec.name] = spec
    _TABLES[(spec.family, spec.contract)][spec.name] = spec.max_m
    _ROWS_PER_CTA[spec.family][spec.name] = spec.rows_per_cta
    return spec


def module_of(name: str) -> str:
    """The dotted module that builds and launches kernel ``name`` (:attr:`KernelSpec.module`)."""
    spec = get(name)
    if spec.module:
        return spec.module
    fam = family(spec.family)
    return fam.seed_module if spec.contract == "seed" else fam.exact_module


def _unregister(name: str) -> None:
    """Drop kernel ``name`` (tests that register a throw-away spec clean up with this)."""
    old = _SPECS.pop(name, None)
    if old is not None:
        _TABLES[(old.family, old.contract)].pop(name, None)
        _ROWS_PER_CTA[old.family].pop(name, None)


def get(name: str) -> KernelSpec:
    """The spec of kernel ``name``; ValueError naming ``kernel`` for an unknown one."""
    spec = _SPECS.get(name)
    if spec is None:
        if not isinstance(name, str):
            raise TypeError(f"kernel: expected a kernel name (str), got {type(name).__name__}")
        raise ValueError(f"kernel: expected one of {sorted(_SPECS)}, got {name!r}")
    return spec


def specs(family: str | None = None, contract: str | None = None) -> Iterator[KernelSpec]:
    """Registered specs in registration order, optionally of one family and/or contract."""
    for s in tuple(_SPECS.values()):
        if (family is None or s.family == family) and (contract is None or s.contract == contract):
            yield s


def table(family: str, contract: str) -> Mapping[str, int]:
    """Live read-only ``name -> max_m`` of one family and contract (registration order)."""
    return MappingProxyType(_TABLES[(family, contract)])


def rows_per_cta_table(family: str) -> Mapping[str, int]:
    """Live read-only ``name -> rows_per_cta`` of one family."""
    return MappingProxyType(_ROWS_PER_CTA[family])


def golden_families() -> dict[str, tuple[str, ...]]:
    """``golden family -> kernel names`` of every spec with ``golden=True`` (registration order)."""
    out: dict[str, tuple[str, ...]] = {}
    for s in specs():
        if s.golden:
            out[s.golden_family] = (*out.get(s.golden_family, ()), s.name)
    return out


# -- the weight families ----------------------------------------------------------------------


_policy_generation = 0  # bumped by bump_policy_generation: older plans are out of date


def bump_policy_generation() -> int:
    """A launch policy changed (e.g. a kill switch re-read): cached plans must be made again."""
    global _policy_generation
    _policy_generation += 1
    return _policy_generation


def policy_generation() -> int:
    """How many times a policy changed: part of :func:`q2gemv.gemv`'s launch-cache key."""
    return _policy_generation


def resolve(dotted: str):
    """The object a dotted name (``"pkg.module.attr"``) names, its module imported on first use."""
    module, _, attr = dotted.rpartition(".")
    return getattr(importlib.import_module(module), attr)


@dataclass(frozen=True)
class FamilySpec:
    """What one weight family *does*: where its weight classes and launch code live.

    Callers look a family up (:func:`family`, :func:`family_of`) instead of comparing
    family names. Dotted names are resolved on use: importing the registry imports
    neither NumPy nor numba.

    Attributes:
        name: the family (``"q2_0"``, ``"w4a16"``): :attr:`KernelSpec.family`.
        title: the format's name in messages (``"Q2_0"``, ``"NVFP4"``).
        host_weight: dotted name of the host weight class (``q2gemv.formats``).
        seed_module: dotted name of the family's seed-contract kernels and
            their launch interface: ``launch_args(name, d_a, dw, d_out,
            rows)`` -> ``(grid, args)``, validated, and ``compiled(name,
            rows)`` -> the dispatcher.
        device_weight: dotted name of the device weight class; its module
            defines ``as_device_weight(weight, stream)`` (a device weight as
            it is, a host one uploaded).
        exact_module: dotted name of the exact contract's module (its
            interface: :mod:`q2gemv.cuda.runtime.launcher`, "the exact-family
            interface").
        exact_kernel: the family's exact kernel (a registered spec's name).
        weight_arrays: attribute names of the host weight's byte arrays.
        device_arrays: attribute names of the device weight's arrays (an
            array a weight has not made yet is None there).
        grouped: its weights carry a block size ``group`` chosen per weight.
        prepared_kernel: the exact kernel that runs on :func:`q2gemv.prepare`'s
            operands (made by ``exact_module``'s prepare), or ``""`` where the
            family takes no prepared activations.
        seed_plan, seed_reason: dotted names of the family's seed-contract
            rule (:mod:`q2gemv.dispatch.seed_rules`): its launches for ``(weight, m,
            kernel)`` and the line :func:`q2gemv.explain` gives for them.
        device_modules: dotted names of the family's other device-code
            modules with ``ptx_specs()`` (kernels that are no registered
            GEMV, e.g. the Q2_0 execution layout's pack and unpack), for
            :mod:`q2gemv.cuda.ptx`.
        layer: dotted name of the family's torch layer class (``q2gemv.nn.<format>``),
            which holds what the model level knows of the format (:mod:`q2gemv.nn.layers`).
        layer_format: the format's name in a layer's state, a ``quantization_config``
            and ``quantize_model(fmt=)`` (``"q2_0"``, ``"nvfp4"``).
        upload_options: the keyword options of :func:`q2gemv.to_device` that the
            family's device class ``upload`` takes (``keep_gguf``, ``keep_packed``).
        prepared_k_unit: the K multiple the prepared kernel needs (0 where the
            family takes no prepared activations): :func:`q2gemv.prepare` checks it.
    """

    name: str
    title: str
    host_weight: str
    seed_module: str
    device_weight: str
    exact_module: str
    exact_kernel: str
    weight_arrays: tuple[str, ...]
    device_arrays: tuple[str, ...]
    grouped: bool
    prepared_kernel: str
    seed_plan: str
    seed_reason: str
    device_modules: tuple[str, ...] = ()
    layer: str = ""
    layer_format: str = ""
    upload_options: tuple[str, ...] = ()
    prepared_k_unit: int = 0

    def __post_init__(self) -> None:
        if self.name not in FAMILIES:
            raise ValueError(f"name: expected one of {FAMILIES}, got {self.name!r}")

    @property
    def prepared(self) -> bool:
        """Whether :func:`q2gemv.prepare`'s activations serve this family's weights."""
        return bool(self.prepared_kernel)

    def host_class(self) -> type:
        """The host weight class (imports its format module)."""
        return resolve(self.host_weight)

    def device_class(self, *, loaded_only: bool = False) -> type | None:
        """The device weight class; with ``loaded_only``, None unless its module is imported.

        ``loaded_only`` answers without importing numba: a device weight can
        only exist once its module is loaded.
        """
        if loaded_only:
            module, _, name = self.device_weight.rpartition(".")
            mod = sys.modules.get(module)
            return None if mod is None else getattr(mod, name)
        return resolve(self.device_weight)

    def as_device_weight(self, weight, stream=0, contract: str = "exact"):
        """``weight`` on the device: a device weight as it is, a host one uploaded on ``stream``
        in the form ``contract``'s kernels read (``"seed"``: the storage bytes only)."""
        module = self.device_weight.rpartition(".")[0]
        return importlib.import_module(module).as_device_weight(weight, stream, contract)

    def seed(self):
        """The seed-contract module (imports numba)."""
        return importlib.import_module(self.seed_module)

    def exact(self):
        """The exact contract's module (imports numba)."""
        return importlib.import_module(self.exact_module)

    def reference(self, kernel: str):
        """The NumPy reference of ``kernel`` (one of this family's registered kernels)."""
        spec = get(kernel)
        if spec.family != self.name:
            raise ValueError(f"kernel: {kernel} is a {spec.family} kernel, not {self.name}")
        return resolve(spec.reference)


@dataclass(frozen=True)
class Route:
    """One call's registry entries, resolved once (:func:`route`): what runs it reads them here.

    Attributes:
        family: the weight's :class:`FamilySpec`; ``contract``: ``"exact"`` or ``"seed"``.
        kernel: the exact contract's kernel on the cuda backend (the plan's
            first kernel where it is an exact kernel of ``family``, else the
            family's ``exact_kernel``); None otherwise.
        module: the module that launches the plan on the cuda backend (exact:
            ``kernel``'s module, the exact-family interface of
            :mod:`q2gemv.cuda.runtime.launcher`; seed: the family's seed
            module); None on the reference backend.
        reference_fn: the NumPy reference of the plan's kernel on the reference
            backend (every launch of a plan gives the same bits); None otherwise.
    """

    family: FamilySpec
    contract: str
    kernel: KernelSpec | None = None
    module: object = None
    reference_fn: object = None


def route(spec: FamilySpec, contract: str, plan, backend: str = "cuda") -> Route:
    """The :class:`Route` of a plan (``(row0, rows, kernel)`` entries) of family ``spec`` under
    ``contract`` (``"exact"`` or ``"seed"``) on ``backend``.

    The cuda backend imports the launching module (numba); the reference
    backend the reference of the plan's first kernel (none for an empty plan).
    """
    if backend == "reference":
        return Route(spec, contract, reference_fn=spec.reference(plan[0][2]) if len(plan) else None)
    if contract != "exact":
        return Route(spec, contract, module=spec.seed())
    kernel = get(spec.exact_kernel)
    first = plan[0][2] if len(plan) else kernel.name
    if first in {s.name for s in specs(spec.name, "exact")}:
        kernel = get(first)
    return Route(spec, contract, kernel, importlib.import_module(module_of(kernel.name)))


_FAMILIES: dict[str, FamilySpec] = {}


def register_family(spec: FamilySpec) -> FamilySpec:
    """Add ``spec`` (one per family name: a second of one name is a ValueError)."""
    if not isinstance(spec, FamilySpec):
        raise TypeError(f"spec: expected a FamilySpec, got {type(spec).__name__}")
    if spec.name in _FAMILIES:
        raise ValueError(f"spec: family {spec.name!r} is already registered")
    _FAMILIES[spec.name] = spec
    return spec


def family(name: str) -> FamilySpec:
    """The spec of family ``name``; ValueError naming ``family`` for an unknown one."""
    spec = _FAMILIES.get(name) if isinstance(name, str) else None
    if spec is None:
        raise ValueError(f"family: expected one of {tuple(_FAMILIES)}, got {name!r}")
    return spec


def prepared_family() -> FamilySpec:
    """The family whose exact kernel runs on :func:`q2gemv.prepare`'s operands."""
    return next(s for s in _FAMILIES.values() if s.prepared_kernel)


def families() -> tuple[FamilySpec, ...]:
    """Every registered family spec, in registration order."""
    return tuple(_FAMILIES.values())


def host_weight_names() -> str:
    """The host weight classes of every family, for messages (``"Q2Weight, Nvfp4Weight"``)."""
    return ", ".join(f.host_weight.rpartition(".")[2] for f in _FAMILIES.values())


def layer_formats() -> tuple[str, ...]:
    """The formats torch layers exist for (:attr:`FamilySpec.layer_format`), in family order."""
    return tuple(f.layer_format for f in _FAMILIES.values() if f.layer_format)


def by_layer_format(fmt: str) -> FamilySpec | None:
    """The family whose torch layers are of format ``fmt``, or None."""
    return next((f for f in _FAMILIES.values() if f.layer_format and f.layer_format == fmt), None)


def family_of(weight) -> tuple[FamilySpec, bool] | None:
    """``(spec, on_device)`` of a host or device weight; None for anything else.

    Imports each family's format module (NumPy) but never numba: a device
    weight's class is only looked at once its module is loaded.
    """
    for spec in _FAMILIES.values():
        if isinstance(weight, spec.host_class()):
            return spec, False
    for spec in _FAMILIES.values():
        cls = spec.device_class(loaded_only=True)
        if cls is not None and isinstance(weight, cls):
            return spec, True
    return None


# -- the built-in kernels ---------------------------------------------------------------------

_Q2REF = "q2gemv.reference.q2_0."
_NVFP4REF = "q2gemv.reference.nvfp4."

for _spec in (
    # Q2_0, seed contract (thread maps: q2gemv.dispatch.plan module docstring).
    KernelSpec("q2_0_gemv", "q2_0", "seed", _Q2REF + "q2_0_gemv", "q2_0_gemv", 4, 1,
               index_bits=64),  # 2 warps per row; activations bf16 by bf16
    KernelSpec("q2_0_gemv_vec", "q2_0", "seed", _Q2REF + "q2_0_gemv_vec", "q2_0_vec", 8, 1,
               a_align=16),
    KernelSpec("q2_0_gemv_vec_batchm", "q2_0", "seed", _Q2REF + "q2_0_gemv_vec_batchm",
               "q2_0_vec", 8, Q2_BATCHM_MAX_M, per_m=True, a_align=16),
    # register-tiled: same per-row order as q2_0_gemv_vec (the references are aliases)
    KernelSpec("q2_0_gemv_vec_rt4", "q2_0", "seed", _Q2REF + "q2_0_gemv_vec_rt4", "q2_0_vec",
               32, 1, a_align=16, rows_per_warp=4),
    KernelSpec("q2_0_gemv_vec_batchm_rt2", "q2_0", "seed", _Q2REF + "q2_0_gemv_vec_batchm_rt2",
               "q2_0_vec", 16, Q2_BATCHM_MAX_M, per_m=True, a_align=16, rows_per_warp=2),
    # W4A16, seed contract: the w4a16_gemv_batchm template (q2gemv.cuda.nvfp4).
    # depth, a_ahead and unroll_words change no arithmetic; each tier's values are the
    # fastest measured (docs/design_notes.md, kernels). batch32 keeps the rolled loop.
    KernelSpec("w4a16_gemv_batch4", "w4a16", "seed", _NVFP4REF + "w4a16_gemv_batch4",
               "w4a16_batchm", 8, 4),
    KernelSpec("w4a16_gemv_batch5", "w4a16", "seed", _NVFP4REF + "w4a16_gemv_batch5",
               "w4a16_batchm", 8, 5),
    KernelSpec("w4a16_gemv_batch6", "w4a16", "seed", _NVFP4REF + "w4a16_gemv_batch6",
               "w4a16_batchm", 8, 6),
    KernelSpec("w4a16_gemv_batch7", "w4a16", "seed", _NVFP4REF + "w4a16_gemv_batch7",
               "w4a16_batchm", 8, 7),
    KernelSpec("w4a16_gemv_batch8", "w4a16", "seed", _NVFP4REF + "w4a16_gemv_batch8",
               "w4a16_batchm", 8, 8, depth=1),
    KernelSpec("w4a16_gemv_batch8_rt2", "w4a16", "seed", _NVFP4REF + "w4a16_gemv_batch8_rt2",
               "w4a16_batchm", 16, 8, rows_per_warp=2, depth=1),
    KernelSpec("w4a16_gemv_batch16", "w4a16", "seed", _NVFP4REF + "w4a16_gemv_batch16",
               "w4a16_batchm", 8, 16, depth=4, a_ahead=True),
    KernelSpec("w4a16_gemv_batch32", "w4a16", "seed", _NVFP4REF + "w4a16_gemv_batch32",
               "w4a16_batchm", 8, 32, depth=1, unroll_words=False),
    # Q2_0, exact contract: exact_prepare once, then this kernel per chunk of max_m rows
    # (q2gemv.cuda.q2_0.exact; 16 weight rows per CTA = one m16 tile; 16-byte operand loads).
    KernelSpec("q2_0_gemv_exact", "q2_0", "exact", "q2gemv.reference.exact.q2_0_gemv_exact",
               "q2_0_exact", 16, Q2_EXACT_MAX_M, per_m=True, a_align=16, grid_wait=True),
    # NVFP4, exact contract: its prepare once, then this kernel per chunk of max_m rows
    # (q2gemv.cuda.nvfp4.exact; 16 weight rows per CTA = one m16 tile, on the weight's
    # execution layout; built per column tiles of 8, M itself a kernel argument).
    KernelSpec("w4a16_gemv_exact", "w4a16", "exact", "q2gemv.reference.exact.w4a16_gemv_exact",
               "w4a16_exact", 16, W4_EXACT_MAX_M, a_align=16, grid_wait=True),
):  # fmt: skip
    register(_spec)
del _spec

register_family(FamilySpec(
    "q2_0", "Q2_0", "q2gemv.formats.q2_0.Q2Weight", "q2gemv.cuda.q2_0.seed",
    "q2gemv.cuda.q2_0.weight.DeviceQ2Weight", "q2gemv.cuda.q2_0.exact_launch", "q2_0_gemv_exact",
    ("raw",), ("b16", "codes", "scales"), grouped=True, prepared_kernel="q2_0_gemv_exact",
    seed_plan="q2gemv.dispatch.seed_rules.q2_0_seed_plan", seed_reason="q2gemv.dispatch.seed_rules.q2_0_seed_reason",
    device_modules=("q2gemv.cuda.q2_0.layout", "q2gemv.cuda.q2_0.exact_batched"),
    layer="q2gemv.nn.q2_0.Q2Linear", layer_format="q2_0", upload_options=("keep_gguf",),
    prepared_k_unit=Q2_EXACT_UNIT,
))  # fmt: skip
register_family(FamilySpec(
    "w4a16", "NVFP4", "q2gemv.formats.nvfp4.Nvfp4Weight", "q2gemv.cuda.nvfp4.seed",
    "q2gemv.cuda.nvfp4.weight.DeviceNvfp4Weight", "q2gemv.cuda.nvfp4.exact", "w4a16_gemv_exact",
    ("packed", "scales"), ("wp", "scales", "codes", "xscales", "zsum"),
    grouped=False, prepared_kernel="",
    seed_plan="q2gemv.dispatch.seed_rules.w4a16_seed_plan", seed_reason="q2gemv.dispatch.seed_rules.w4a16_seed_reason",
    device_modules=("q2gemv.cuda.nvfp4.layout",),
    layer="q2gemv.nn.nvfp4.Nvfp4Linear", layer_format="nvfp4", upload_options=("keep_packed",),
))  # fmt: skip

__all__ = [
    "KernelSpec",
    "FamilySpec",
    "Route",
    "route",
    "family",
    "family_of",
    "families",
    "host_weight_names",
    "layer_formats",
    "bump_policy_generation",
    "policy_generation",
    "by_layer_format",
    "DEFAULT_LAYER_FORMAT",
    "prepared_family",
    "register_family",
    "resolve",
    "module_of",
    "register",
    "get",
    "specs",
    "table",
    "rows_per_cta_table",
    "golden_families",
    "Q2_BATCHM_MAX_M",
    "Q2_EXACT_MAX_M",
    "W4_EXACT_MAX_M",
    "Q2_EXACT_UNIT",
]
