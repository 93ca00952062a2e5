"""The kernel registry (q2gemv.dispatch.registry) and every table derived from it.

Each registered kernel must have: a NumPy reference that exists, golden vectors in
the shipped file of its golden family, and a PTX build entry (compiled by
tests/cuda/test_ptx.py, which iterates over the registry: nothing is compiled here).
"""

from __future__ import annotations

import importlib

import pytest

from q2gemv import api
from q2gemv.dispatch import nvfp4_tiers as tiers
from q2gemv.dispatch import plan as launch
from q2gemv.dispatch import registry as kernels
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


# -- the family specs --------------------------------------------------------------------------

FAMILY_SPECS = kernels.families()


def test_every_kernel_family_has_one_spec():
    assert {f.name for f in FAMILY_SPECS} == {s.family for s in SPECS} == set(kernels.FAMILIES)
    for f in FAMILY_SPECS:
        assert kernels.family(f.name) is f
    with pytest.raises(ValueError, match=r"^family: expected one of"):
        kernels.family("q4_0")
    with pytest.raises(ValueError, match=r"^family: expected one of"):
        kernels.family(None)
    with pytest.raises(ValueError, match=r"already registered"):
        kernels.register_family(FAMILY_SPECS[0])


@pytest.mark.parametrize("fam", FAMILY_SPECS, ids=lambda f: f.name)
def test_family_spec_names_what_exists(fam):
    """Every dotted name resolves; the exact kernel is the family's exact spec; seed rules plan."""
    exact = kernels.get(fam.exact_kernel)
    assert (exact.family, exact.contract) == (fam.name, "exact")
    assert fam.exact_kernel in [s.name for s in kernels.specs(fam.name, "exact")]
    assert kernels.module_of(fam.exact_kernel) == fam.exact_module
    assert fam.reference(fam.exact_kernel) is _resolve(exact.reference)
    assert isinstance(fam.host_class(), type)
    assert callable(kernels.resolve(fam.seed_plan)) and callable(kernels.resolve(fam.seed_reason))
    from q2gemv.cuda.runtime.launcher import ExactFamily

    mod = fam.exact()
    for name in ExactFamily.__annotations__.keys() | {
        "check_k",
        "prepare_launch",
        "chunk_launches",
    }:
        assert hasattr(mod, name), (fam.exact_module, name)
    assert callable(fam.seed().launch_args) and callable(fam.seed().compiled)
    assert fam.device_class().family == fam.name
    other = next(s for s in SPECS if s.family != fam.name)
    with pytest.raises(ValueError, match=r"^kernel: "):
        fam.reference(other.name)


def test_family_of_finds_host_weights_and_refuses_the_rest():
    import numpy as np

    import q2gemv

    q2 = q2gemv.quantize_q2_0(np.ones((4, 128), np.float32), 64)
    assert kernels.family_of(q2) == (kernels.family("q2_0"), False)
    w4 = q2gemv.Nvfp4Weight.from_float(np.ones((4, 32), np.float32))
    assert kernels.family_of(w4) == (kernels.family("w4a16"), False)
    assert kernels.family_of(np.ones(4)) is None and kernels.family_of(None) is None
    assert {n: a is getattr(q2, n) for n, a in api.weight_arrays(q2).items()} == {"raw": True}
    assert {n: a is getattr(w4, n) for n, a in api.weight_arrays(w4).items()} == {
        "packed": True,
        "scales": True,
    }


def test_an_exact_kernel_variant_is_its_module_and_its_spec():
    """A registered exact spec naming its module runs through api, launcher and interop as is.

    (Here the variant's module is the default's, with 4 rows per launch: the claim of
    docs/architecture.md, "Where to add things", that a variant needs no other edit.)
    """
    import numpy as np

    import q2gemv
    from q2gemv.golden.check import assert_bits_equal
    from q2gemv.reference.exact import q2_0_gemv_exact

    name = "test_only_q2_0_exact_variant"
    kernels.register(
        kernels.KernelSpec(
            name, "q2_0", "exact", "q2gemv.reference.exact.q2_0_gemv_exact", "q2_0_exact", 16, 4,
            per_m=True, a_align=16, golden=False, module="q2gemv.cuda.q2_0.exact",
        )
    )  # fmt: skip
    try:
        assert kernels.module_of(name) == "q2gemv.cuda.q2_0.exact"
        rng = np.random.default_rng(5)
        w = q2gemv.quantize_q2_0(rng.standard_normal((3, 64)).astype(np.float32), 64)
        a = rng.standard_normal((5, 64)).astype(q2gemv.BF16)
        assert list(q2gemv.plan(w, 5, name)) == [(0, 4, name), (4, 1, name)]
        got = q2gemv.gemv(a, w, kernel=name, backend="cuda")
        assert_bits_equal(got.view(np.uint16), q2_0_gemv_exact(a, w).view(np.uint16), name)
    finally:
        kernels._unregister(name)


def test_upload_options_are_the_device_classes_upload_keywords():
    """``FamilySpec.upload_options`` (what ``to_device`` passes on) names exactly the keyword
    options each family's device ``upload`` takes besides the weight and the stream."""
    import inspect

    for f in kernels.families():
        params = inspect.signature(f.device_class().upload).parameters
        kw = {n for n, p in params.items() if p.kind is inspect.Parameter.KEYWORD_ONLY}
        kw |= {n for n in params if n.startswith("keep_")}
        assert set(f.upload_options) == kw, f.name


def test_a_policy_change_moves_the_launch_cache_generation():
    from q2gemv.dispatch import nvfp4_tiers

    before = kernels.policy_generation()
    nvfp4_tiers.reload_env()
    assert kernels.policy_generation() == before + 1
