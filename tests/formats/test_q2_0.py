"""block_q2_0 packing, ggml's own vectors, quantizers, validation, and who owns a weight's bytes."""

from __future__ import annotations

import array
import mmap
from importlib import resources

import ml_dtypes
import numpy as np
import pytest

from q2gemv import Q2Weight, quantize_q2_0
from q2gemv.formats import q2_0 as fmt
from q2gemv.formats._frozen import is_frozen
from q2gemv.golden.check import assert_bits_equal
from tests.q2_cases import _q2
from tests.weight_cases import K, N, _chain, _q2_raw, _writeable_inputs


def _ggml():
    path = resources.files("q2gemv.golden") / "data" / "ggml_q2_0_reference_vectors.npz"
    with resources.as_file(path) as p, np.load(p) as z:
        return {k: z[k] for k in z.files}


GGML = _ggml()
GGML_CASES = [(g, i) for g in (64, 128) for i in range(3)]


@pytest.mark.parametrize("g,i", GGML_CASES)
def test_quantize_matches_ggml_bytes(g, i):
    x = GGML[f"g{g}_case{i}_x"]
    # case 2 overflows fp16 scales on purpose (ggml writes d = Inf): allowed explicitly
    got = quantize_q2_0(x, group=g, allow_nonfinite=True).raw
    assert_bits_equal(got, GGML[f"g{g}_case{i}_raw"], f"g{g} case{i}")


@pytest.mark.parametrize("g,i", GGML_CASES)
def test_dequantize_matches_ggml(g, i):
    x = GGML[f"g{g}_case{i}_x"]
    w = Q2Weight.from_bytes(GGML[f"g{g}_case{i}_raw"], *x.shape, group=g)
    assert_bits_equal(w.dequantize(), GGML[f"g{g}_case{i}_dequant"], f"g{g} case{i}")


def test_ggml_adversarial_case_has_overflowing_scale_reported_by_validate():
    x = GGML["g128_case2_x"]
    w = Q2Weight.from_bytes(GGML["g128_case2_raw"], *x.shape, group=128)
    findings = w.validate()
    assert len(findings) == 1 and "inf" in findings[0]


def test_bit_layout_lsb_first_every_slot():
    # code c in slot j of byte 0 (all other codes 1 = zero weight)
    for j in range(4):
        for c in range(4):
            codes = np.ones((1, 64), np.uint8)
            codes[0, j] = c
            w = Q2Weight.from_codes(codes, np.ones((1, 1), np.float16), group=64)
            byte = w.raw[2]
            other = sum(1 << (2 * s) for s in range(4) if s != j)
            assert byte == (c << (2 * j)) | other
            assert w.dequantize()[0, j] == c - 1


@pytest.mark.parametrize("group", [64, 128])
def test_round_trip_codes_scales(group):
    rng = np.random.default_rng(1)
    codes = rng.integers(0, 4, (5, 3 * group), dtype=np.uint8)
    scales = rng.standard_normal((5, 3)).astype(np.float16)
    w = Q2Weight.from_codes(codes, scales, group=group)
    assert w.raw.size == 5 * 3 * fmt.block_bytes(group)
    assert_bits_equal(w.codes(), codes)
    assert_bits_equal(w.scales(), scales)
    want = (codes.astype(np.float32) - 1) * np.repeat(scales.astype(np.float32), group, axis=1)
    assert_bits_equal(w.dequantize(), want)


def test_float32_scales_round_to_fp16_nearest_even():
    # 1 + 2^-11 is a tie between fp16 1.0 and 1 + 2^-10: even mantissa -> 1.0
    s = np.array([[1 + 2**-11, 1 + 3 * 2**-11, 70000.0]], np.float32)
    w = Q2Weight.from_codes(np.ones((1, 192), np.uint8), s, group=64)
    assert w.scales().tolist() == [[1.0, 1 + 2**-9, np.inf]]


def test_from_bytes_wraps_without_copy_and_is_immutable():
    raw = np.frombuffer(bytes(2 * 34), np.uint8)  # memory nothing can write: no copy
    w = Q2Weight.from_bytes(raw, 2, 128)
    assert np.shares_memory(w.raw, raw)
    with pytest.raises(ValueError):
        w.raw[0] = 1
    with pytest.raises(AttributeError):
        w.n = 3  # type: ignore[misc]


def test_from_bytes_accepts_bytes():
    w = Q2Weight.from_bytes(bytes(18), 1, 64, group=64)
    assert w.k == 64 and w.group == 64


@pytest.mark.parametrize(
    "call,exc,needle",
    [
        (lambda: Q2Weight.from_bytes(np.zeros(33, np.uint8), 1, 128), ValueError, "raw"),
        (lambda: Q2Weight.from_bytes(np.zeros(34, np.int8), 1, 128), TypeError, "raw"),
        (lambda: Q2Weight.from_bytes(np.zeros((2, 17), np.uint8), 1, 128), ValueError, "raw"),
        (lambda: Q2Weight.from_bytes(np.zeros(34, np.uint8), 1, 100), ValueError, "k"),
        (lambda: Q2Weight.from_bytes(np.zeros(34, np.uint8), 1, 128, 32), ValueError, "group"),
        (lambda: Q2Weight.from_bytes(np.zeros(34, np.uint8), 0, 128), ValueError, "n"),
        (
            lambda: Q2Weight.from_codes(np.ones((1, 64), np.uint8), np.ones((1, 1)), 64),
            TypeError,
            "scales",
        ),
        (
            lambda: Q2Weight.from_codes(
                np.full((1, 64), 4, np.uint8), np.ones((1, 1), np.float16), 64
            ),
            ValueError,
            "codes",
        ),
        (
            lambda: Q2Weight.from_codes(np.ones((1, 64), np.int32), np.ones((1, 1), np.float16)),
            TypeError,
            "codes",
        ),
        (
            lambda: Q2Weight.from_codes(
                np.ones((1, 64), np.uint8), np.ones((1, 2), np.float16), 64
            ),
            ValueError,
            "scales",
        ),
        (lambda: quantize_q2_0(np.ones((2, 100), np.float32)), ValueError, "k"),
        (lambda: quantize_q2_0(np.ones((2, 128), np.int32)), TypeError, "w"),
        (lambda: quantize_q2_0(np.ones((2, 128)), method="nope"), ValueError, "method"),
    ],
)
def test_bad_input_names_the_argument(call, exc, needle):
    with pytest.raises(exc, match=needle):
        call()


def test_validate_reports_nan_and_inf_scales():
    s = np.array([[1.0, np.nan], [np.inf, -np.inf]], np.float16)
    w = Q2Weight.from_codes(np.ones((2, 128), np.uint8), s, group=64)
    (finding,) = w.validate()
    assert finding.startswith("3 non-finite")


def test_absmean_recipe():
    x = np.array([[0.0, 0.5, -1.5, 3.0] * 16], np.float32)  # mean|x| = 1.25
    w = quantize_q2_0(x, group=64, method="absmean")
    assert w.scales()[0, 0] == np.float16(1.25)
    # x / gamma = 0, 0.4, -1.2, 2.4 -> rint -> 0, 0, -1, 2 -> clip -> 0, 0, -1, 1
    assert w.codes()[0, :4].tolist() == [1, 1, 0, 2]
    assert quantize_q2_0(np.zeros((1, 64)), group=64, method="absmean").codes().max() == 1


def test_group_from_nbytes():
    assert fmt.group_from_nbytes(34 * 4, 512) == 128
    assert fmt.group_from_nbytes(18 * 8, 512) == 64
    with pytest.raises(ValueError, match="neither"):
        fmt.group_from_nbytes(100, 512)


# -- issue 33 item 11: no silent Inf/NaN scales ---------------------------------------------


@pytest.mark.parametrize("method", ["ggml", "absmean"])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_quantize_refuses_non_finite_weights(method, bad):
    x = np.ones((2, 128), np.float32)
    x[1, 70] = bad
    with pytest.raises(ValueError, match=r"^w: expected finite weights .* at \[1, 70\]"):
        quantize_q2_0(x, group=64, method=method)


@pytest.mark.parametrize("method", ["ggml", "absmean"])
def test_quantize_refuses_a_scale_that_overflows_fp16(method):
    x = np.ones((2, 128), np.float32)
    x[1, 64:] = 1e5  # amax and mean|x| both beyond fp16's 65504
    with pytest.raises(ValueError, match=r"^w: the fp16 scale of row 1, block 1 .* overflows"):
        quantize_q2_0(x, group=64, method=method)
    x[1, 64:] = 65504.0  # the largest finite fp16 scale is fine
    assert quantize_q2_0(x, group=64, method=method).validate() == []


def test_allow_nonfinite_keeps_ggml_bytes():
    x = np.ones((1, 64), np.float32)
    x[0, 3] = 1e5
    w = quantize_q2_0(x, group=64, allow_nonfinite=True)
    assert np.isinf(w.scales()[0, 0]) and len(w.validate()) == 1
    x[0, 3] = np.nan
    w = quantize_q2_0(x, group=64, allow_nonfinite=True)
    assert np.isnan(w.scales()[0, 0]) and w.codes().tolist() == [[1] * 64]
    with pytest.raises(TypeError, match="allow_nonfinite: expected a bool"):
        quantize_q2_0(x, group=64, allow_nonfinite=1)


def test_q2_sizes_in_fixed_width_ints_do_not_wrap():
    """np.int16(4000) * 18 wrapped to 6464 (accepted 6464 bytes); 2**40 * ... wrapped to 0."""
    from q2gemv.formats.q2_0 import Q2Weight

    with pytest.raises(ValueError, match=r"^raw: expected exactly 72000 bytes for n=4000 k=64"):
        Q2Weight.from_bytes(bytes(6464), np.int16(4000), np.int16(64), 64)
    want = 2**40 * (2**40 // 128) * 34
    with pytest.raises(ValueError, match=rf"^raw: expected exactly {want} bytes"):
        Q2Weight(np.zeros(0, np.uint8), np.int64(2**40), np.int64(2**40), 128)
    with pytest.raises(ValueError, match=r"^raw: expected exactly 1800 bytes for n=100"):
        Q2Weight.from_bytes(bytes(8), np.int8(100), np.int8(64), np.int8(64))


def test_q2_numpy_int_sizes_give_python_ints_and_the_same_weight():
    from q2gemv.formats.q2_0 import Q2Weight, row_bytes

    w = _q2(3, 128, 64)
    v = Q2Weight.from_bytes(w.raw.tobytes(), np.int8(3), np.uint8(128), np.int16(64))
    assert (type(v.n), type(v.k), type(v.group)) == (int, int, int)
    assert (v.n, v.k, v.group) == (3, 128, 64) and v.raw.tobytes() == w.raw.tobytes()
    assert row_bytes(np.int32(2**31 - 64), np.int8(64)) == (2**31 - 64) // 64 * 18
    assert type(row_bytes(np.int16(128), 64)) is int


def test_quantize_takes_a_numpy_int_group():
    """quantize_q2_0(group=np.int8(64)) raised OverflowError."""
    x = np.random.default_rng(0).standard_normal((2, 128)).astype(np.float32)
    got = quantize_q2_0(x, group=np.int8(64))
    assert got.group == 64 and type(got.group) is int
    assert got.raw.tobytes() == quantize_q2_0(x, group=64).raw.tobytes()


@pytest.mark.parametrize(
    "n,k,exc,needle",
    [
        (np.float32(3), 128, TypeError, r"^n: expected an int, got float32"),
        (3, True, TypeError, r"^k: expected an int, got bool"),
        (np.uint8(0), 128, ValueError, r"^n: expected >= 1, got 0"),
        (2, np.int8(-64), ValueError, r"^k: expected >= 1, got -64"),
    ],
)
def test_q2_size_messages_still_name_the_argument(n, k, exc, needle):
    from q2gemv.formats.q2_0 import Q2Weight

    with pytest.raises(exc, match=needle):
        Q2Weight.from_bytes(bytes(68), n, k, 128)


class _NoDunderBuffer:
    """Mixin: hides ``__buffer__`` (as on Python 3.10/3.11) while the C buffer slot still works."""

    def __getattribute__(self, name):
        if name == "__buffer__":
            raise AttributeError(name)
        return super().__getattribute__(name)


class _OldMmap(_NoDunderBuffer, mmap.mmap):
    pass


class _OldArray(_NoDunderBuffer, array.array):
    pass


def test_from_bytes_takes_a_read_only_file_map_without_a_copy(tmp_path):
    """mmap.mmap raised TypeError on Python 3.10/3.11 (no __buffer__ there)."""
    from q2gemv.formats.q2_0 import Q2Weight

    w = _q2(2, 128, 64)
    p = tmp_path / "raw.bin"
    p.write_bytes(w.raw.tobytes())
    with open(p, "rb") as f:
        for cls in (mmap.mmap, _OldMmap):
            m = cls(f.fileno(), 0, access=mmap.ACCESS_READ)
            assert not hasattr(m, "__buffer__") or cls is mmap.mmap
            v = Q2Weight.from_bytes(m, 2, 128, 64)
            assert v.raw.tobytes() == w.raw.tobytes()
            assert np.shares_memory(v.raw, np.frombuffer(m, np.uint8))  # wrapped, not copied
            with pytest.raises(ValueError):
                v.raw.flags.writeable = True
            del v


@pytest.mark.parametrize("cls", [mmap.mmap, _OldMmap])
def test_from_bytes_copies_a_writeable_map(cls):
    from q2gemv.formats.q2_0 import Q2Weight

    w = _q2(2, 128, 64)
    m = cls(-1, w.nbytes)
    m[:] = w.raw.tobytes()
    v = Q2Weight.from_bytes(m, 2, 128, 64)
    m[:4] = b"\xff\xff\xff\xff"
    assert v.raw.tobytes() == w.raw.tobytes()


@pytest.mark.parametrize("cls", [array.array, _OldArray])
@pytest.mark.parametrize("typecode", ["B", "H", "I"])
def test_from_bytes_takes_an_array_array(cls, typecode):
    """array.array raised TypeError on Python 3.10/3.11; its item size does not matter."""
    from q2gemv.formats.q2_0 import Q2Weight

    w = _q2(2, 128, 64)  # 36 bytes: a whole number of 1-, 2- and 4-byte items
    a = cls(typecode)
    a.frombytes(w.raw.tobytes())
    v = Q2Weight.from_bytes(a, 2, 128, 64)
    assert v.raw.tobytes() == w.raw.tobytes()
    a[0] = 0
    assert v.raw.tobytes() == w.raw.tobytes()  # copied: the array is writeable


def test_from_bytes_refusals_name_raw():
    from q2gemv.formats.q2_0 import Q2Weight

    with pytest.raises(TypeError, match=r"^raw: expected a buffer .*got list"):
        Q2Weight.from_bytes([0] * 36, 2, 128, 64)
    strided = memoryview(bytes(72))[::2]
    with pytest.raises(ValueError, match=r"^raw: expected a C-contiguous buffer"):
        Q2Weight.from_bytes(strided, 2, 128, 64)


@pytest.mark.parametrize("method", ["ggml", "absmean"])
def test_quantize_q2_0_takes_bf16_as_its_fp32_value(method):
    rng = np.random.default_rng(12)
    w = rng.standard_normal((3, 128)).astype(ml_dtypes.bfloat16)
    got = quantize_q2_0(w, 64, method)
    want = quantize_q2_0(w.astype(np.float32), 64, method)
    assert got.raw.tobytes() == want.raw.tobytes()


def test_quantize_q2_0_still_refuses_integers():
    with pytest.raises(TypeError, match="^w: expected a float array, got int32"):
        quantize_q2_0(np.zeros((1, 128), np.int32))


@pytest.mark.parametrize("kind", ["writeable", "read-only-view-of-writeable", "owned-read-only"])
def test_q2weight_copies_memory_that_can_be_written(kind):
    raw = _q2_raw()
    src = _writeable_inputs(raw)[kind]
    w = Q2Weight(src, N, K, 64)
    assert not np.shares_memory(w.raw, raw)
    for arr in _chain(w.raw):  # no array in the weight's chain can be made writeable again
        assert not arr.flags.writeable
        with pytest.raises(ValueError, match="WRITEABLE"):
            arr.flags.writeable = True
    before = w.raw.tobytes()
    raw[:] = 0xAB  # the caller writes its own buffer: the weight does not change
    if kind == "owned-read-only":
        src.flags.writeable = True
        src[:] = 0xCD
    assert w.raw.tobytes() == before


def test_q2weight_issue_reproducer_is_refused():
    w = Q2Weight.from_bytes(_q2_raw(), N, K, 64)
    with pytest.raises(ValueError):
        w.raw.flags.writeable = True
    with pytest.raises(ValueError):
        w.raw[0] = 0xAB


@pytest.mark.parametrize("kind", ["bytes", "bytearray", "memoryview-of-bytes"])
def test_q2weight_from_bytes_buffer_objects(kind):
    data = _q2_raw().tobytes()
    buf = {"bytes": data, "bytearray": bytearray(data), "memoryview-of-bytes": memoryview(data)}[
        kind
    ]
    w = Q2Weight.from_bytes(buf, N, K, 64)
    assert w.raw.tobytes() == data
    view = np.frombuffer(buf, np.uint8)
    # bytes cannot change: wrapped; a bytearray can: copied
    assert np.shares_memory(w.raw, view) == (kind != "bytearray")
    with pytest.raises(ValueError):
        w.raw.flags.writeable = True


def test_read_only_file_map_is_wrapped_without_copy(tmp_path):
    data = _q2_raw().tobytes()
    p = tmp_path / "w.bin"
    p.write_bytes(data)
    with open(p, "rb") as f:
        m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    raw = np.frombuffer(m, np.uint8)
    assert is_frozen(raw)
    w = Q2Weight.from_bytes(raw, N, K, 64)
    assert np.shares_memory(w.raw, raw)  # zero-copy: the loaders' path
    del w, raw
    m.close()


def test_writeable_file_map_is_copied(tmp_path):
    p = tmp_path / "w.bin"
    p.write_bytes(_q2_raw().tobytes())
    with open(p, "r+b") as f:
        m = mmap.mmap(f.fileno(), 0)
    raw = np.frombuffer(m, np.uint8)
    w = Q2Weight.from_bytes(raw, N, K, 64)
    assert not np.shares_memory(w.raw, raw)
    before = w.raw.tobytes()
    raw[0] ^= 0xFF  # writes the file; the weight keeps its bytes
    assert w.raw.tobytes() == before
    del raw
    m.close()
