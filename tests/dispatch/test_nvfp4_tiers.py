"""The W4A16 tier table: pure selection (exhaustive), kill switches, resolution, launch plans."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from q2gemv.cuda.nvfp4 import seed as w4cuda
from q2gemv.dispatch import nvfp4_tiers as T
from q2gemv.dispatch.nvfp4_tiers import (
    BATCH8_RT2,
    BATCH16,
    BATCH32,
    W4A16_BATCHM_WIDTHS,
    W4a16BatchmTiers,
    explain_tier,
    plan_w4a16,
    select_tier,
)

ALL_ENV = T.ENV_NO_EXACT_M + T.ENV_NO_BATCH8_RT
ALL_NAMES = T.candidate_kernel_names()


@pytest.fixture
def clean_env(monkeypatch):
    """No kill switch set; the cache re-read before and after the test."""
    for v in ALL_ENV:
        monkeypatch.delenv(v, raising=False)
    T.reload_env()
    yield monkeypatch
    monkeypatch.undo()
    T.reload_env()


# -- select_tier ---------------------------------------------------------------------------


def _oracle(m, present, exact_m):
    """The rule restated: smallest allowed present width >= m."""
    if m == 0:
        return None
    ok = [
        w
        for w, p in zip(W4A16_BATCHM_WIDTHS, present, strict=True)
        if p and w >= m and (exact_m or w in (4, 8))
    ]
    return W4A16_BATCHM_WIDTHS.index(min(ok)) if ok else None


def test_select_tier_exhaustive():
    for present in itertools.product([False, True], repeat=5):
        for exact_m in (False, True):
            for m in range(0, 12):
                assert select_tier(m, present, exact_m) == _oracle(m, present, exact_m), (
                    m,
                    present,
                    exact_m,
                )


def test_select_tier_by_hand():
    full = [True] * 5
    assert [select_tier(m, full, True) for m in range(10)] == [None, 0, 0, 0, 0, 1, 2, 3, 4, None]
    assert [select_tier(m, full, False) for m in range(10)] == [None, 0, 0, 0, 0, 4, 4, 4, 4, None]
    # a missing tier widens to the next present one
    assert select_tier(5, [True, False, True, True, True], True) == 2
    # 4 and 8 are never hidden
    assert select_tier(4, [True, False, False, False, False], False) == 0
    assert select_tier(8, [False, False, False, False, True], False) == 4
    # nothing covers
    assert select_tier(5, [True, False, False, False, False], True) is None
    assert select_tier(6, [True, True, True, True, False], False) is None


@pytest.mark.parametrize("present", [[True] * 4, [True] * 6, []])
def test_select_tier_wrong_present_length(present):
    with pytest.raises(ValueError, match="present"):
        select_tier(1, present, True)


def test_select_tier_bad_m():
    with pytest.raises(ValueError, match="m"):
        select_tier(-1, [True] * 5, True)
    with pytest.raises(TypeError, match="m"):
        select_tier(True, [True] * 5, True)
    with pytest.raises(TypeError, match="m"):
        select_tier(2.0, [True] * 5, True)


# -- environment switches ------------------------------------------------------------------


@pytest.mark.parametrize("var", T.ENV_NO_EXACT_M)
@pytest.mark.parametrize("value", ["1", "0", ""])
def test_exact_m_switch_is_a_presence_check(clean_env, var, value):
    assert T.exact_m_tiers_enabled()
    clean_env.setenv(var, value)
    assert T.exact_m_tiers_enabled()  # cached: no effect until reload
    T.reload_env()
    assert not T.exact_m_tiers_enabled()
    assert T.env_switches().exact_m_source == var
    assert T.batch8_rt_enabled()
    clean_env.delenv(var)
    T.reload_env()
    assert T.exact_m_tiers_enabled()


@pytest.mark.parametrize("var", T.ENV_NO_BATCH8_RT)
@pytest.mark.parametrize("value", ["1", "0", ""])
def test_batch8_rt_switch_is_a_presence_check(clean_env, var, value):
    assert T.batch8_rt_enabled()
    clean_env.setenv(var, value)
    T.reload_env()
    assert not T.batch8_rt_enabled()
    assert T.env_switches().batch8_rt_source == var
    assert T.exact_m_tiers_enabled()


def test_switches_hide_but_tables_keep_their_kernels(clean_env):
    tiers = W4a16BatchmTiers.resolve(ALL_NAMES)
    assert tiers.kernel(5) == "w4a16_gemv_batch5"
    clean_env.setenv("Q2GEMV_NO_GEMV_EXACT_M_TIERS", "1")
    T.reload_env()
    assert tiers.kernel(5) == BATCH8_RT2  # hidden from selection, not unloaded
    assert tiers.kernels[1] == "w4a16_gemv_batch5"
    assert tiers.width(7) == 8 and tiers.width(4) == 4
    assert tiers.kernel(5, exact_m=True) == "w4a16_gemv_batch5"  # explicit override


# -- the resolved table ---------------------------------------------------------------------


def test_default_table_declines_everything():
    t = W4a16BatchmTiers()
    assert t.present() == (False,) * 5 and not t.has_base()
    assert all(t.kernel(m) is None and t.width(m) is None for m in range(12))


def test_resolve_with_everything(clean_env):
    t = W4a16BatchmTiers.resolve(ALL_NAMES)
    assert t.kernels == (
        "w4a16_gemv_batch4",
        "w4a16_gemv_batch5",
        "w4a16_gemv_batch6",
        "w4a16_gemv_batch7",
        BATCH8_RT2,
    )
    assert t.has_base()
    assert [t.width(m) for m in range(10)] == [None, 4, 4, 4, 4, 5, 6, 7, 8, None]


def test_resolve_width8_preference(clean_env):
    classic = "w4a16_gemv_batch8"
    assert W4a16BatchmTiers.resolve([classic]).kernels[4] == classic
    assert W4a16BatchmTiers.resolve([BATCH8_RT2]).kernels[4] == BATCH8_RT2
    clean_env.setenv("ATLAS_NO_BATCH8_RT", "1")
    T.reload_env()
    assert W4a16BatchmTiers.resolve([classic, BATCH8_RT2]).kernels[4] == classic
    assert W4a16BatchmTiers.resolve([BATCH8_RT2]).kernels[4] is None


def test_resolve_subset(clean_env):
    t = W4a16BatchmTiers.resolve(["w4a16_gemv_batch4", "w4a16_gemv_batch7"])
    assert t.present() == (True, False, False, True, False)
    assert [t.kernel(m) for m in (1, 4, 5, 7, 8)] == [
        "w4a16_gemv_batch4",
        "w4a16_gemv_batch4",
        "w4a16_gemv_batch7",
        "w4a16_gemv_batch7",
        None,
    ]
    t = W4a16BatchmTiers.resolve(["w4a16_gemv_batch8"])
    assert not t.has_base() and t.kernel(1) == "w4a16_gemv_batch8"


def test_resolve_asks_the_resolver(clean_env):
    asked = []

    def resolver(names):
        asked.append(tuple(names))
        return [n for n in names if n.endswith(("4", "6"))]

    t = W4a16BatchmTiers.resolve(resolver=resolver)
    assert asked == [ALL_NAMES]
    assert t.present() == (True, False, True, False, False)


def test_resolve_rejects_a_string():
    with pytest.raises(TypeError, match="available"):
        W4a16BatchmTiers.resolve("w4a16_gemv_batch4")


def test_table_validates_its_entries():
    with pytest.raises(ValueError, match="kernels"):
        W4a16BatchmTiers(("a",) * 4)
    with pytest.raises(TypeError, match="kernels"):
        W4a16BatchmTiers((1, None, None, None, None))


# -- plan and explanation ------------------------------------------------------------------


def _expected_kernel(rows, tiers, exact_m):
    if rows <= 8 and tiers.kernel(rows, exact_m=exact_m):
        return tiers.kernel(rows, exact_m=exact_m)
    return BATCH16 if rows <= 16 else BATCH32


@pytest.mark.parametrize(
    "avail",
    [ALL_NAMES, (), ("w4a16_gemv_batch4",), ("w4a16_gemv_batch5", "w4a16_gemv_batch8")],
)
def test_plan_covers_every_row(avail):
    tiers = W4a16BatchmTiers.resolve(avail)
    for exact_m in (False, True):
        for m in range(0, 100):
            plan = plan_w4a16(m, tiers, exact_m=exact_m)
            row = 0
            for r0, rows, name in plan:
                assert r0 == row and 1 <= rows <= 32
                assert name == _expected_kernel(rows, tiers, exact_m)
                row += rows
            assert row == m
            assert len(plan) == -(-m // 32)


def test_plan_by_hand(clean_env):
    tiers = W4a16BatchmTiers.resolve(ALL_NAMES)
    assert plan_w4a16(0, tiers) == []
    assert plan_w4a16(5, tiers) == [(0, 5, "w4a16_gemv_batch5")]
    assert plan_w4a16(9, tiers) == [(0, 9, BATCH16)]
    assert plan_w4a16(16, tiers) == [(0, 16, BATCH16)]
    assert plan_w4a16(17, tiers) == [(0, 17, BATCH32)]
    assert plan_w4a16(32, tiers) == [(0, 32, BATCH32)]
    assert plan_w4a16(33, tiers) == [(0, 32, BATCH32), (32, 1, "w4a16_gemv_batch4")]
    assert plan_w4a16(77, tiers) == [(0, 32, BATCH32), (32, 32, BATCH32), (64, 13, BATCH16)]
    assert plan_w4a16(3, W4a16BatchmTiers()) == [(0, 3, BATCH16)]  # table declines


def test_plan_bad_args():
    with pytest.raises(ValueError, match="m"):
        plan_w4a16(-1, W4a16BatchmTiers())
    with pytest.raises(TypeError, match="tiers"):
        plan_w4a16(1, [True] * 5)


def test_explain(clean_env):
    tiers = W4a16BatchmTiers.resolve(["w4a16_gemv_batch4", "w4a16_gemv_batch6", BATCH8_RT2])
    text = explain_tier(5, tiers)
    assert "m = 5" in text and "(True, False, True, False, True)" in text
    assert "width 6 -> w4a16_gemv_batch6" in text and "width 5 absent" in text
    assert "exact-M tiers 5/6/7: allowed" in text
    assert "(0, 5, 'w4a16_gemv_batch6')" in text
    assert "9..16" in explain_tier(12, tiers) and "17..32" in explain_tier(20, tiers)
    assert "chunks of 32" in explain_tier(40, tiers)
    assert "nothing" in explain_tier(0, tiers)
    clean_env.setenv("Q2GEMV_NO_GEMV_EXACT_M_TIERS", "0")
    T.reload_env()
    text = explain_tier(5, tiers)
    assert "hidden (Q2GEMV_NO_GEMV_EXACT_M_TIERS is set)" in text
    assert "w4a16_gemv_batch8_rt2" in text and "width 6 hidden by the exact-M switch" in text


def _tiers():
    from q2gemv.dispatch.nvfp4_tiers import W4a16BatchmTiers

    return W4a16BatchmTiers.resolve([f"w4a16_gemv_batch{w}" for w in (4, 5, 6, 7, 8)])


def test_plan_w4a16_of_the_largest_m_costs_no_memory():
    """plan_w4a16(2**31 - 1, tiers) built a 67-million-entry list (over 2 GiB)."""
    import tracemalloc

    from q2gemv.dispatch.nvfp4_tiers import plan_w4a16

    m = 2**31 - 1
    tracemalloc.start()
    try:
        plan = plan_w4a16(m, _tiers())
        n = len(plan)
        first, last = plan[0], plan[-1]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20
    assert n == -(-m // 32)
    assert first == (0, 32, "w4a16_gemv_batch32")
    assert last == (m - 31, 31, "w4a16_gemv_batch32")
    assert plan_w4a16(77, _tiers()) == [
        (0, 32, "w4a16_gemv_batch32"),
        (32, 32, "w4a16_gemv_batch32"),
        (64, 13, "w4a16_gemv_batch16"),
    ]


@pytest.mark.parametrize("m", [2**31, 2**40, np.int64(2**40)])
def test_tier_planning_refuses_m_beyond_plan_bound(m):
    """plan_w4a16(2**40) and explain_tier(2**31) were accepted where q2gemv.plan refuses."""
    import q2gemv
    from q2gemv.dispatch.nvfp4_tiers import explain_tier, plan_w4a16, select_tier
    from q2gemv.formats.nvfp4 import Nvfp4Weight

    w = Nvfp4Weight.from_float(np.ones((1, 16), np.float32))
    with pytest.raises(ValueError) as want:
        q2gemv.plan(w, m)
    for call in (
        lambda: plan_w4a16(m, _tiers()),
        lambda: explain_tier(m, _tiers()),
        lambda: select_tier(m, [True] * 5, True),
        lambda: _tiers().kernel(m),
    ):
        with pytest.raises(ValueError) as got:
            call()
        assert str(got.value) == str(want.value)


def test_explain_tier_of_the_largest_m_is_short():
    from q2gemv.dispatch.nvfp4_tiers import explain_tier

    text = explain_tier(2**31 - 1, _tiers())
    assert "67108864 launches in all" in text and len(text) < 4000


@pytest.mark.parametrize("bad", ["no", "", 1, 0, 1.0, [True]])
def test_exact_m_must_be_a_bool(bad):
    """plan_w4a16(exact_m="no") treated the string as True (exact-M tiers on)."""
    from q2gemv.dispatch.nvfp4_tiers import plan_w4a16

    t = _tiers()
    for call in (
        lambda: plan_w4a16(5, t, exact_m=bad),
        lambda: t.kernel(5, exact_m=bad),
        lambda: t.width(5, exact_m=bad),
    ):
        with pytest.raises(TypeError, match=r"^exact_m: expected a bool or None, got"):
            call()


def test_tier_planning_argument_types():
    from q2gemv.dispatch.nvfp4_tiers import explain_tier, plan_w4a16

    t = _tiers()
    assert plan_w4a16(5, t, exact_m=np.bool_(True)) == [(0, 5, "w4a16_gemv_batch5")]
    assert plan_w4a16(5, t, exact_m=False) == [(0, 5, "w4a16_gemv_batch8")]
    assert plan_w4a16(np.int16(33), t) == [
        (0, 32, "w4a16_gemv_batch32"),
        (32, 1, "w4a16_gemv_batch4"),
    ]
    for bad in (True, np.bool_(False), 3.0, "4"):
        with pytest.raises(TypeError, match=r"^m: expected an int"):
            plan_w4a16(bad, t)
        with pytest.raises(TypeError, match=r"^m: expected an int"):
            explain_tier(bad, t)
    with pytest.raises(TypeError, match=r"^tiers: expected a W4a16BatchmTiers, got str"):
        explain_tier(4, "tiers")


@pytest.mark.parametrize(
    ("present", "exc", "match"),
    [
        (None, TypeError, r"present: expected a sequence of 5 bools"),
        (5, TypeError, r"present: expected a sequence of 5 bools"),
        ("TTTTT", TypeError, r"present: expected a sequence of 5 bools"),
        ([1, 1, 1, 1, 1], TypeError, r"present: expected bool flags, got int"),
        ([True, None, True, True, True], TypeError, r"present: expected bool flags, got NoneType"),
        ([True] * 4, ValueError, r"present: expected 5 flags"),
    ],
    ids=["None", "int", "str", "ints", "None-flag", "four"],
)
def test_select_tier_names_present(present, exc, match):
    with pytest.raises(exc, match=match):
        select_tier(1, present, True)


def test_select_tier_names_exact_m():
    with pytest.raises(TypeError, match=r"exact_m: expected a bool, got str"):
        select_tier(1, [True] * 5, "yes")
    assert select_tier(5, np.ones(5, bool), np.bool_(True)) == 1  # numpy bools are bools


def test_tier_table_refuses_unknown_kernels():
    with pytest.raises(ValueError, match=r"kernels: width 4 expected None or a W4A16 kernel"):
        W4a16BatchmTiers(("w4a16_gemv_batch4_typo", None, None, None, None))
    with pytest.raises(ValueError, match=r"kernels: width 8 expected .*got 'w4a16_gemv_batch4'"):
        W4a16BatchmTiers((None, None, None, None, "w4a16_gemv_batch4"))  # too narrow for 8 rows
    t = W4a16BatchmTiers(("w4a16_gemv_batch8", None, None, None, "w4a16_gemv_batch32"))
    assert t.kernel(3) == "w4a16_gemv_batch8"  # wider is allowed (same bits, slower)


def test_kernel_tables_agree():
    assert T.W4A16_KERNEL_MAX_M == w4cuda.MAX_M
    for names in ([], T.candidate_kernel_names()):
        W4a16BatchmTiers.resolve(available=names)  # every resolved table is accepted


def test_check_plan_accepts_every_tier_plan():
    for mask in itertools.product([False, True], repeat=5):
        names = [
            n for n, keep in zip(T.candidate_kernel_names(), mask + (True,), strict=True) if keep
        ]
        tiers = W4a16BatchmTiers.resolve(available=names)
        for m in (0, 1, 4, 5, 7, 8, 9, 16, 17, 32, 33, 70):
            plan = T.plan_w4a16(m, tiers)
            assert T.check_plan(plan, m) == plan


@pytest.mark.parametrize(
    ("plan", "m", "match"),
    [
        ([(0, 4, "w4a16_gemv_batch3")], 4, r"plan: launch 0: unknown kernel 'w4a16_gemv_batch3'"),
        ([(0, 4, ["w4a16_gemv_batch4"])], 4, r"unknown kernel"),
        ([(0, 5, "w4a16_gemv_batch4")], 5, r"plan: launch 0 .*1\.\.4 rows of w4a16_gemv_batch4"),
        ([(0, 0, "w4a16_gemv_batch4")], 0, r"plan: launch 0"),
        ([(0, 4, "w4a16_gemv_batch4"), (5, 4, "w4a16_gemv_batch4")], 9, r"expected rows 4\.\."),
        ([(0, 4, "w4a16_gemv_batch4"), (2, 4, "w4a16_gemv_batch4")], 6, r"expected rows 4\.\."),
        ([(0, 4, "w4a16_gemv_batch4")], 8, r"plan: covers rows 0\.\.3, expected 0\.\.7"),
        ([(0, True, "w4a16_gemv_batch4")], 1, r"plan: launch 0"),
        ([(0, 4)], 4, r"plan: launch 0: expected \(row0, rows, kernel\)"),
        (5, 4, r"plan: expected \(row0, rows, kernel\) launches"),
    ],
)
def test_check_plan_refuses(plan, m, match):
    with pytest.raises(ValueError, match=match):
        T.check_plan(plan, m)
