"""The kernel registry (q2gemv.kernels) and every table derived from it.

Each registered kernel must have: a NumPy reference that exists, golden vectors in
the shipped file of its golden family, and a PTX build entry (compiled by
tests/test_ptx.py, which iterates over the registry: nothing is compiled here).
"""

from __future__ import annotations

import importlib

import pytest

from q2gemv import api, kernels, launch, tiers
from q2gemv.golden import gen
from q2gemv.golden.store import default_data_dir, meta_from_array, read_npz

SPECS = list(kernels.specs())


def _resolve(dotted: str):
    mod, _, attr = dotted.rpartition(".")
    return getattr(importlib.import_module(mod), attr)


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_reference_exists(spec):
    fn = _resolve(spec.reference)
    assert callable(fn), spec.reference
    assert fn.__name__ in (spec.name, "q2_0_gemv_vec", "w4a16_gemv") or spec.name in fn.__name__


def _golden_kernels(family: str) -> set[str]:
    arrays = read_npz(default_data_dir() / f"gemv_{family}.npz")
    meta = meta_from_array(arrays["__meta__"])
    return {k for case in meta["cases"] for k in case["spec"]["kernels"]}


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_golden_vectors_cover_it(spec):
    assert spec.golden
    assert spec.name in gen.FAMILY_KERNELS[spec.golden_family]
    assert gen.MAX_M[spec.name] == spec.max_m
    assert spec.name in _golden_kernels(spec.golden_family)


def test_ptx_build_entry_for_every_kernel():
    from q2gemv.cuda.ptx import kernel_specs

    built = {name.split("@")[0] for name, _, _ in kernel_specs()}
    assert {s.name for s in SPECS} <= built


def test_derived_tables_are_live_views():
    assert dict(api.Q2_KERNELS) == {s.name: s.max_m for s in kernels.specs("q2_0", "seed")}
    assert dict(api.W4A16_KERNELS) == dict(tiers.W4A16_KERNEL_MAX_M)
    assert dict(api.Q2_EXACT_KERNELS) == {"q2_0_gemv_exact": kernels.Q2_EXACT_MAX_M}
    assert launch.Q2_ROWS_PER_CTA["q2_0_gemv_vec_rt4"] == 32
    spec = kernels.KernelSpec(
        "test_only_q2_kernel", "q2_0", "seed", "q2gemv.reference.q2_0.q2_0_gemv_vec",
        "q2_0_vec", rows_per_cta=16, max_m=8, per_m=True, a_align=16, rows_per_warp=2,
        golden=False,
    )  # fmt: skip
    try:
        kernels.register(spec)
        assert api.Q2_KERNELS["test_only_q2_kernel"] == 8
        assert launch.q2_grid("test_only_q2_kernel", 33) == (3, 1, 1)
        assert "test_only_q2_kernel" not in kernels.golden_families()["q2_0"]
        with pytest.raises(ValueError, match="already registered"):
            kernels.register(spec)
    finally:
        kernels._unregister("test_only_q2_kernel")
    assert "test_only_q2_kernel" not in api.Q2_KERNELS
    with pytest.raises(ValueError, match="kernel: expected one of"):
        kernels.get("nope")


@pytest.mark.parametrize(
    "kw,needle",
    [
        ({"family": "fp8"}, "family"),
        ({"contract": "fast"}, "contract"),
        ({"reference": "nodots"}, "reference"),
        ({"max_m": 0}, "max_m"),
        ({"index_bits": 16}, "index_bits"),
    ],
)
def test_spec_refusals(kw, needle):
    base = dict(
        name="x", family="q2_0", contract="seed", reference="a.b", template="q2_0_vec",
        rows_per_cta=8, max_m=1,
    )  # fmt: skip
    with pytest.raises(ValueError, match=needle):
        kernels.KernelSpec(**(base | kw))
