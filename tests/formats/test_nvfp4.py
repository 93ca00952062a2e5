"""NVFP4 format: decode tables against ml_dtypes, hand golden tables, encoders, the weight class."""

from __future__ import annotations

import pickle

import ml_dtypes
import numpy as np
import pytest

from q2gemv.formats import nvfp4 as fmt
from q2gemv.formats._frozen import frozen
from q2gemv.formats.nvfp4 import Nvfp4Weight
from q2gemv.golden.check import assert_bits_equal
from tests.weight_cases import _chain, _nv_parts, _writeable_inputs

F4 = ml_dtypes.float4_e2m1fn
F8 = ml_dtypes.float8_e4m3fn


# -- decode tables -------------------------------------------------------------------


def test_e2m1_table_matches_ml_dtypes_every_code():
    codes = np.arange(16, dtype=np.uint8)
    want = codes.view(F4).astype(np.float32)  # a full byte 0..15 is a valid float4 pattern
    assert_bits_equal(fmt.E2M1_VALUES, want, "E2M1 table")


def test_e2m1_decode_masks_to_low_nibble():
    # a packed byte's high nibble must not leak into the decode of the low one
    assert_bits_equal(fmt.e2m1_decode(np.array([0xF3, 0x37, 0x80])), np.float32([1.5, 6.0, 0.0]))


def test_e2m1_golden_by_hand():
    want = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
    assert fmt.E2M1_VALUES[:8].tolist() == want
    assert fmt.E2M1_VALUES[8:].tolist() == [-v for v in want]
    assert np.signbit(fmt.E2M1_VALUES[8])  # code 8 is -0.0
    twice = [0, 1, 2, 3, 4, 6, 8, 12]  # the exact contract's integers: 2 * e2m1, -0 as 0
    assert fmt.E2M1_TWICE.tolist() == twice + [-v for v in twice]
    assert fmt.E2M1_TWICE.dtype == np.int64 and not fmt.E2M1_TWICE.flags.writeable


def test_e4m3_table_matches_ml_dtypes_all_256_patterns():
    b = np.arange(256, dtype=np.uint8)
    want = b.view(F8).astype(np.float32)
    nan = np.isnan(want)
    assert np.array_equal(np.flatnonzero(nan), [0x7F, 0xFF])
    assert np.array_equal(np.isnan(fmt.E4M3_VALUES), nan)
    assert_bits_equal(fmt.E4M3_VALUES[~nan], want[~nan], "E4M3 table")


@pytest.mark.parametrize(
    "bits, value",
    [
        (0x00, 0.0),
        (0x80, -0.0),
        (0x01, 2.0**-9),  # smallest subnormal
        (0x07, 7 * 2.0**-9),  # largest subnormal
        (0x08, 2.0**-6),  # smallest normal
        (0x38, 1.0),
        (0x39, 1.125),
        (0x40, 2.0),
        (0x23, 0.171875),
        (0x7E, 448.0),
        (0xFE, -448.0),
        (0xB8, -1.0),
    ],
)
def test_e4m3_golden_by_hand(bits, value):
    got = fmt.e4m3_decode(np.uint8(bits))
    assert_bits_equal(np.float32(got), np.float32(value), f"e4m3 0x{bits:02X}")


def test_e4m3_nan_patterns():
    assert np.isnan(fmt.e4m3_decode(np.array([0x7F, 0xFF], np.uint8))).all()


# -- encoders ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "x, code",
    [
        (0.25, 0x0),  # tie 0 | 0.5 -> even code 0
        (0.75, 0x2),  # tie 0.5 | 1 -> 1.0
        (1.25, 0x2),  # tie 1 | 1.5 -> 1.0
        (1.75, 0x4),  # tie 1.5 | 2 -> 2.0
        (2.5, 0x4),  # tie 2 | 3 -> 2.0
        (3.5, 0x6),  # tie 3 | 4 -> 4.0
        (5.0, 0x6),  # tie 4 | 6 -> 4.0
        (-0.75, 0xA),
        (-5.0, 0xE),
        (0.26, 0x1),
        (5.01, 0x7),
        (7.0, 0x7),  # saturates at 6
        (1e30, 0x7),
        (np.inf, 0x7),
        (-np.inf, 0xF),
        (-0.1, 0x8),  # negative that rounds to zero: -0 (ModelOpt's sign rule)
        (-0.0, 0x0),  # -0.0 itself: sign bit only for x < 0
        (0.0, 0x0),
    ],
)
def test_e2m1_encode_ties_and_saturation(x, code):
    assert int(fmt.e2m1_encode(np.float32(x))) == code


def test_e2m1_encode_every_grid_point_round_trips():
    codes = np.arange(16, dtype=np.uint8)
    got = fmt.e2m1_encode(fmt.E2M1_VALUES)
    want = np.where(codes == 8, 0, codes)  # -0.0 encodes as +0 (x < 0 is false)
    assert np.array_equal(got, want)


def test_e2m1_encode_agrees_with_ml_dtypes():
    rng = np.random.default_rng(1)
    x = np.concatenate(
        [
            (rng.standard_normal(20000) * 3).astype(np.float32),
            np.arange(-64, 65, dtype=np.float32) / 8,  # every tie and grid point, both signs
        ]
    )
    got = fmt.e2m1_encode(x)
    want = x.astype(F4).view(np.uint8) & 0xF
    assert np.array_equal(fmt.e2m1_decode(got), fmt.e2m1_decode(want))
    nonzero = fmt.e2m1_decode(got) != 0
    assert np.array_equal(got[nonzero], want[nonzero])


def test_e2m1_encode_refuses_nan():
    with pytest.raises(ValueError, match="x"):
        fmt.e2m1_encode(np.float32([1.0, np.nan]))


@pytest.mark.parametrize(
    "x, bits",
    [
        (1.0625, 0x38),  # tie 1.0 | 1.125 -> even mantissa 0x38
        (1.1875, 0x3A),  # tie 1.125 | 1.25 -> 0x3A
        (2.0**-10, 0x00),  # tie 0 | 2^-9 -> 0
        (3 * 2.0**-10, 0x02),  # tie 2^-9 | 2^-8 -> 0x02
        (15 * 2.0**-10, 0x08),  # tie 7*2^-9 | 2^-6 -> 0x08 (subnormal -> normal)
        (448.0, 0x7E),
        (464.0, 0x7E),
        (465.0, 0x7E),  # saturates (ml_dtypes would give NaN)
        (1e9, 0x7E),
        (np.inf, 0x7E),
        (-np.inf, 0xFE),
        (-0.0, 0x80),
        (np.nan, 0x7F),
        (1.0 / 6.0, 0x23),
    ],
)
def test_e4m3_encode_golden(x, bits):
    assert int(fmt.e4m3_encode(np.float32(x))) == bits


def test_e4m3_encode_agrees_with_ml_dtypes_after_clamp():
    rng = np.random.default_rng(2)
    x = (rng.standard_normal(50000) * np.exp2(rng.integers(-14, 10, 50000))).astype(np.float32)
    mids = ((fmt.E4M3_VALUES[:0x7E] + fmt.E4M3_VALUES[1:0x7F]) / 2).astype(np.float32)
    x = np.concatenate([x, fmt.E4M3_VALUES[:0x7F], mids, -mids])
    want = np.clip(x, -448, 448).astype(F8).view(np.uint8)
    assert np.array_equal(fmt.e4m3_encode(x), want)


# -- nibble packing ----------------------------------------------------------------------


def test_pack_bit_diagram():
    # even element in the low nibble
    assert fmt.pack_nibbles(np.array([[0x1, 0x2]], np.uint8)).tolist() == [[0x21]]
    assert fmt.unpack_nibbles(np.array([[0xA7]], np.uint8)).tolist() == [[0x7, 0xA]]


def test_every_code_in_every_slot_round_trips():
    for slot in range(16):
        for code in range(16):
            c = np.zeros((1, 16), np.uint8)
            c[0, slot] = code
            p = fmt.pack_nibbles(c)
            assert p[0, slot // 2] == code << (4 * (slot % 2))
            assert np.array_equal(fmt.unpack_nibbles(p), c)


# -- the weight class ----------------------------------------------------------------------


def _parts(n=2, k=32):
    return np.zeros((n, k // 2), np.uint8), np.full((n, k // 16), 0x38, np.uint8)


def _immutable(x):
    """``x``'s values in memory nothing can write (like the loaders' read-only file maps)."""
    return np.frombuffer(x.tobytes(), dtype=x.dtype).reshape(x.shape)


def test_from_parts_is_copy_free_and_read_only():
    packed, scales = map(_immutable, _parts())
    w = Nvfp4Weight.from_parts(packed, scales, 0.5)
    assert (w.n, w.k, w.groups_per_row) == (2, 32, 2)
    assert np.shares_memory(w.packed, packed) and np.shares_memory(w.scales, scales)
    assert not w.packed.flags.writeable and not w.scales.flags.writeable
    assert w.global_scale == 0.5 and isinstance(w.global_scale, float)


def test_from_parts_copies_writeable_parts_once():
    # the ownership rule (q2gemv.formats._frozen): writeable input is copied, so a later
    # write to the caller's array cannot reach the weight
    packed, scales = _parts()
    w = Nvfp4Weight.from_parts(packed, scales, 0.5)
    assert not np.shares_memory(w.packed, packed) and not np.shares_memory(w.scales, scales)
    assert packed.flags.writeable  # the caller's array is left alone
    packed[0, 0] = 0xAB
    assert w.packed[0, 0] == 0


def test_from_parts_accepts_float8_scales_without_copy():
    packed, scales = map(_immutable, _parts())
    s8 = scales.view(F8)
    w = Nvfp4Weight.from_parts(packed, s8, 1.0)
    assert w.scales.dtype == np.uint8 and np.shares_memory(w.scales, scales)


@pytest.mark.parametrize("g", [0.1, np.float64(0.1), np.array(0.1), np.array([0.1], np.float32)])
def test_global_scale_is_an_exact_fp32(g):
    packed, scales = _parts()
    w = Nvfp4Weight.from_parts(packed, scales, g)
    assert w.global_scale == float(np.float32(0.1))


@pytest.mark.parametrize(
    "packed, scales, g, exc, name",
    [
        (np.zeros((2, 16), np.int8), np.zeros((2, 2), np.uint8), 1.0, TypeError, "packed"),
        ([[0] * 16] * 2, np.zeros((2, 2), np.uint8), 1.0, TypeError, "packed"),
        (np.zeros(16, np.uint8), np.zeros((2, 2), np.uint8), 1.0, ValueError, "packed"),
        (np.zeros((2, 12), np.uint8), np.zeros((2, 1), np.uint8), 1.0, ValueError, "packed"),
        (np.zeros((2, 0), np.uint8), np.zeros((2, 0), np.uint8), 1.0, ValueError, "packed"),
        (np.zeros((0, 8), np.uint8), np.zeros((0, 1), np.uint8), 1.0, ValueError, "packed"),
        (np.zeros((2, 16), np.uint8), np.zeros((2, 3), np.uint8), 1.0, ValueError, "scales"),
        (np.zeros((2, 16), np.uint8), np.zeros((2, 2), np.float32), 1.0, TypeError, "scales"),
        (np.zeros((2, 16), np.uint8), np.zeros((2, 2), np.uint8), "1", TypeError, "global_scale"),
        (np.zeros((2, 16), np.uint8), np.zeros((2, 2), np.uint8), True, TypeError, "global_scale"),
        (
            np.zeros((2, 16), np.uint8),
            np.zeros((2, 2), np.uint8),
            np.ones(2),
            ValueError,
            "global_scale",
        ),
    ],
)
def test_bad_parts_name_the_argument(packed, scales, g, exc, name):
    with pytest.raises(exc, match=name):
        Nvfp4Weight.from_parts(packed, scales, g)


def test_from_codes_validates():
    with pytest.raises(ValueError, match="codes"):
        Nvfp4Weight.from_codes(np.full((1, 16), 16, np.uint8), np.zeros((1, 1), np.uint8), 1.0)
    with pytest.raises(TypeError, match="codes"):
        Nvfp4Weight.from_codes(np.zeros((1, 16), np.int32), np.zeros((1, 1), np.uint8), 1.0)


def test_dequantize_by_hand():
    codes = np.zeros((1, 32), np.uint8)
    codes[0, 0] = 0x3  # 1.5
    codes[0, 1] = 0xF  # -6
    codes[0, 16] = 0x1  # 0.5
    scales = np.array([[0x40, 0x01]], np.uint8)  # 2.0, 2^-9
    w = Nvfp4Weight.from_codes(codes, scales, 0.75)
    want = np.zeros((1, 32), np.float32)
    want[0, 0] = 1.5 * 2.0 * 0.75
    want[0, 1] = -6 * 2.0 * 0.75
    want[0, 16] = 0.5 * 2.0**-9 * 0.75
    assert_bits_equal(w.dequantize(), want, "dequantize")


def test_dequantize_rounds_once_at_g():
    codes = np.full((1, 16), 0x7, np.uint8)  # 6
    w = Nvfp4Weight.from_codes(codes, np.array([[0x7E]], np.uint8), 0.1)  # 448
    want = np.float32(np.float32(6 * 448) * np.float32(0.1))
    assert_bits_equal(w.dequantize(), np.full((1, 16), want, np.float32))


def test_dequantize_nan_scale_and_inf_g():
    codes = np.zeros((1, 32), np.uint8)
    codes[0, 16] = 0x2
    w = Nvfp4Weight.from_codes(codes, np.array([[0x7F, 0x38]], np.uint8), 1.0)
    d = w.dequantize()
    assert np.isnan(d[0, :16]).all() and np.array_equal(d[0, 16:], np.eye(1, 16)[0])
    w = Nvfp4Weight.from_codes(codes, np.array([[0x38, 0x38]], np.uint8), np.inf)
    d = w.dequantize()
    assert d[0, 16] == np.inf and np.isnan(d[0, 0])  # 0 * Inf


def test_validate():
    packed, scales = _parts(3, 48)
    assert Nvfp4Weight.from_parts(packed, scales, 1.0).validate() == []
    scales = scales.copy()
    scales[1, 2] = 0x7F
    scales[2, 0] = 0xFF
    found = Nvfp4Weight.from_parts(packed, scales, np.nan).validate()
    assert len(found) == 2
    assert "2 NaN E4M3 scale byte(s)" in found[0] and "(row 1, group 2) = 0x7F" in found[0]
    assert "(row 2, group 0) = 0xFF" in found[0]
    assert "non-finite global scale" in found[1]
    assert Nvfp4Weight.from_parts(packed, _parts(3, 48)[1], np.inf).validate() != []


# -- compressed-tensors divisor ---------------------------------------------------------------


def test_global_scale_from_divisor():
    assert fmt.global_scale_from_divisor(4.0) == 0.25  # power of two: exact
    assert fmt.global_scale_from_divisor(np.array([3.0], np.float32)) == float(
        np.float32(1) / np.float32(3)
    )
    assert fmt.global_scale_from_divisor(0.0) == np.inf
    with pytest.raises(ValueError, match="weight_global_scale"):
        fmt.global_scale_from_divisor(np.array([1.0, 2.0]))


def _f32_neighbours(x: np.float32, steps: int) -> list[np.float32]:
    out, lo, hi = [x], x, x
    for _ in range(steps):
        lo, hi = np.nextafter(lo, np.float32(0)), np.nextafter(hi, np.float32(np.inf))
        out += [lo, hi]
    return out


def test_divisor_from_global_scale_inverts_global_scale_from_divisor():
    assert fmt.divisor_from_global_scale(0.25) == 4.0  # powers of two both ways
    assert fmt.divisor_from_global_scale(2.0**-100) == 2.0**100
    for bad in (0.0, np.inf, -np.inf, np.nan, 2.0**-140):  # reciprocal overflows: no divisor
        assert fmt.divisor_from_global_scale(bad) is None
    rng = np.random.default_rng(7)
    gs = (rng.uniform(1e-6, 10, 4000) * rng.choice([1, -1], 4000)).astype(np.float32)
    none = 0
    for g in gs:
        d = fmt.divisor_from_global_scale(g)
        if d is not None:
            assert np.float32(d) == d and fmt.global_scale_from_divisor(d) == float(g)
            continue
        none += 1  # none: no fp32 within 8 steps of 1/g loads back as g either
        near = np.float32(1) / g
        assert all(np.float32(1) / d != g for d in _f32_neighbours(near, 8)), g
    assert 0 < none < len(gs) // 4  # the reciprocal is not onto: some multipliers have none


def test_from_compressed_tensors_matches_divisor_dequant():
    rng = np.random.default_rng(3)
    codes = rng.integers(0, 16, (4, 64), dtype=np.uint8)
    scales = fmt.e4m3_encode(rng.uniform(0.01, 400, (4, 4)))
    g_ct = np.float32(1024.0)  # a power of two: the reciprocal is exact
    w = Nvfp4Weight.from_compressed_tensors(fmt.pack_nibbles(codes), scales, g_ct)
    e = fmt.e2m1_decode(codes)
    s = np.repeat(fmt.e4m3_decode(scales), 16, axis=1)
    assert_bits_equal(w.dequantize(), (e * (s / g_ct)).astype(np.float32))
    # a non-power-of-two divisor: within one fp32 ulp of the divisor form
    g_ct = np.float32(3.0)
    w = Nvfp4Weight.from_compressed_tensors(fmt.pack_nibbles(codes), scales, g_ct)
    want = (e * (s / g_ct)).astype(np.float32)
    ulp = np.spacing(np.abs(want))
    assert (np.abs(w.dequantize() - want) <= ulp).all()


# -- quantizer --------------------------------------------------------------------------------


def test_from_float_by_hand():
    row = np.zeros(32, np.float32)
    # block 0: amax 2688 -> g = 1, block scale 2688/6 = 448 (0x7E), q = x / 448
    row[:8] = [2688, 448, -1344, 112, 336, -0.0, -50, 1000]
    # block 1: amax 1 -> sb = 1/6 -> e4m3 0.171875 (0x23); q = x / 0.171875
    row[16:19] = [1.0, -0.5, 0.0859375]  # 5.8 -> 6; -2.9 -> -3; 0.5 -> 0.5
    w = Nvfp4Weight.from_float(row[None])
    assert w.global_scale == 1.0
    assert w.scales.tolist() == [[0x7E, 0x23]]
    c = w.codes()[0]
    assert c[:8].tolist() == [0x7, 0x2, 0xD, 0x0, 0x2, 0x0, 0x8, 0x4]  # 1000/448=2.23 -> 2
    assert c[16:19].tolist() == [0x7, 0xD, 0x1]
    assert not c[8:16].any() and not c[19:].any()


def test_from_float_zero_block_and_zero_tensor():
    w = Nvfp4Weight.from_float(np.zeros((2, 32), np.float32))
    assert w.global_scale == 1.0 and (w.scales == 0x01).all() and not w.packed.any()
    x = np.zeros((1, 32), np.float32)
    x[0, 0] = 1.0
    w = Nvfp4Weight.from_float(x)
    assert w.scales[0, 1] == 0x01  # zero block: scale clamped up to 2^-9


def test_from_float_matches_an_ml_dtypes_implementation_of_the_recipe():
    rng = np.random.default_rng(4)
    x = (rng.standard_normal((16, 256)) * np.exp2(rng.integers(-6, 6, (16, 1)))).astype(np.float32)
    x[3, 16:32] *= 1e-3  # a block far below the tensor amax
    w = Nvfp4Weight.from_float(x)
    f32 = np.float32
    g = f32(np.abs(x).max() / f32(2688))
    xb = x.reshape(16, 16, 16)
    sb = (np.abs(xb).max(axis=2) / f32(f32(6) * g)).astype(np.float32)
    s = np.clip(sb, f32(2.0**-9), f32(448)).astype(F8)
    q = (xb / (s.astype(np.float32) * g)[..., None]).astype(np.float32)
    codes = q.astype(F4)  # ml_dtypes saturates float4 at +-6
    assert w.global_scale == float(g)
    assert np.array_equal(w.scales, s.view(np.uint8))
    got = fmt.e2m1_decode(w.codes()).reshape(16, 16, 16)
    assert np.array_equal(got, codes.astype(np.float32))  # values (zero signs may differ)
    # and the dequantized weights sit within one E2M1 step of the input
    step = np.repeat(fmt.e4m3_decode(w.scales), 16, axis=1) * f32(w.global_scale)
    assert (np.abs(w.dequantize() - x) <= step * 1.0001).all()


def test_from_float_accepts_bf16_and_rejects_bad_input():
    x = np.ones((2, 16), ml_dtypes.bfloat16)
    assert Nvfp4Weight.from_float(x).codes().tolist() == [[0x7] * 16] * 2
    with pytest.raises(ValueError, match="w"):
        Nvfp4Weight.from_float(np.full((1, 16), np.inf, np.float32))
    with pytest.raises(ValueError, match="w"):
        Nvfp4Weight.from_float(np.zeros((1, 24), np.float32))
    with pytest.raises(ValueError, match="w"):
        Nvfp4Weight.from_float(np.zeros(16, np.float32))
    with pytest.raises(TypeError, match="w"):
        Nvfp4Weight.from_float(np.zeros((1, 16), np.int32))


def _nvfp4_parts():
    from q2gemv.formats.nvfp4 import Nvfp4Weight

    w = Nvfp4Weight.from_float(np.linspace(-3, 3, 64, dtype=np.float32).reshape(2, 32))
    return np.array(w.packed), np.array(w.scales)


def _host_error(g) -> tuple[type, str]:
    from q2gemv.formats.nvfp4 import Nvfp4Weight

    packed, scales = _nvfp4_parts()
    with pytest.raises((TypeError, ValueError)) as e:
        Nvfp4Weight(packed, scales, g)
    return e.type, str(e.value)


def test_the_validator_names_its_argument_and_is_used_by_the_divisor_path():
    from q2gemv.formats.nvfp4 import check_global_scale, global_scale_from_divisor

    assert check_global_scale(np.array([[0.1]])) == float(np.float32(0.1))
    with pytest.raises(ValueError, match=r"^weight_global_scale: expected a value representable"):
        global_scale_from_divisor(1e39)
    with pytest.raises(TypeError, match=r"^x: expected a real number, got complex"):
        check_global_scale(1j, "x")


def test_a_copy_of_a_nan_global_scale_keeps_its_bits():
    from q2gemv.formats.nvfp4 import Nvfp4Weight

    w = Nvfp4Weight(np.zeros((1, 8), np.uint8), np.zeros((1, 1), np.uint8), float("-nan"))
    got = pickle.loads(pickle.dumps(w)).global_scale
    assert np.float32(got).view(np.uint32) == np.float32(w.global_scale).view(np.uint32)


@pytest.mark.parametrize(
    "g_ct", [1e-40, -1e-40, np.float32(2.0**-129), np.array([1e-39], np.float32)]
)
def test_compressed_tensors_divisor_with_an_infinite_reciprocal_is_refused(g_ct):
    from q2gemv.formats.nvfp4 import Nvfp4Weight, global_scale_from_divisor

    with pytest.raises(ValueError, match=r"^weight_global_scale: expected a divisor whose fp32"):
        global_scale_from_divisor(g_ct)
    packed, scales = np.zeros((1, 8), np.uint8), np.full((1, 1), 0x38, np.uint8)
    with pytest.raises(ValueError, match=r"^weight_global_scale: expected a divisor"):
        Nvfp4Weight.from_compressed_tensors(packed, scales, g_ct)


def test_smallest_divisor_with_a_finite_reciprocal_is_kept():
    from q2gemv.formats.nvfp4 import global_scale_from_divisor

    assert global_scale_from_divisor(2.0**-127) == 2.0**127
    assert global_scale_from_divisor(0.0) == np.inf  # a special given as such: validate() reports


@pytest.mark.parametrize("kind", ["writeable", "read-only-view-of-writeable", "owned-read-only"])
def test_nvfp4_parts_are_copied_when_they_can_be_written(kind):
    packed, scales = _nv_parts()
    w = Nvfp4Weight.from_parts(
        _writeable_inputs(packed)[kind], _writeable_inputs(scales)[kind], 1.0
    )
    for part, src in ((w.packed, packed), (w.scales, scales)):
        assert not np.shares_memory(part, src)
        for arr in _chain(part):
            with pytest.raises(ValueError, match="WRITEABLE"):
                arr.flags.writeable = True
    before = (w.packed.tobytes(), w.scales.tobytes())
    packed[:] = 0xAB
    scales[:] = 0xCD
    assert (w.packed.tobytes(), w.scales.tobytes()) == before


def test_nvfp4_immutable_parts_are_wrapped():
    packed, scales = (frozen(x) for x in _nv_parts())  # bytes-backed, like a read-only map
    w = Nvfp4Weight.from_parts(packed, scales, 1.0)
    assert np.shares_memory(w.packed, packed) and np.shares_memory(w.scales, scales)


@pytest.mark.parametrize(
    "g",
    [2**200, -(2**200), 2**2000, 1e39, np.float64(-1e39), np.array([1e300]), 1e-46, 2.0**-151],
    ids=["2**200", "-2**200", "2**2000", "1e39", "-1e39-f64", "array-1e300", "1e-46", "2**-151"],
)
def test_global_scale_fp32_cannot_hold_is_refused(g):
    packed, scales = _nv_parts()
    with pytest.raises(ValueError, match=r"global_scale: expected a value representable in fp32"):
        Nvfp4Weight(packed, scales, g)
    with pytest.raises(ValueError, match=r"global_scale: expected a value representable"):
        Nvfp4Weight.from_parts(packed, scales, g)


@pytest.mark.parametrize(
    ("g", "want"),
    [
        (float("inf"), np.inf),  # an IEEE special given as such is kept (validate() reports it)
        (-np.inf, -np.inf),
        (0, 0.0),
        (2.0**-149, 2.0**-149),  # the smallest fp32 subnormal
        (3.4e38, float(np.float32(3.4e38))),
        (2**100, 2.0**100),
        (0.1, float(np.float32(0.1))),
    ],
)
def test_global_scale_representable_or_special_is_kept(g, want):
    w = Nvfp4Weight(*_nv_parts(), g)
    assert w.global_scale == want or (np.isnan(want) and np.isnan(w.global_scale))


def test_global_scale_nan_is_kept():
    assert np.isnan(Nvfp4Weight(*_nv_parts(), float("nan")).global_scale)


def test_divisor_fp32_cannot_hold_is_refused():
    packed, scales = _nv_parts()
    with pytest.raises(ValueError, match=r"weight_global_scale: expected a value representable"):
        Nvfp4Weight.from_compressed_tensors(packed, scales, 2**2000)
