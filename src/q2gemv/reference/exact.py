"""NumPy reference of the exact contract (``numerics="exact"``): a value, not an order.

The contract (also in ``docs/numerics.md``; every backend computes exactly this). The
activations are bf16 or fp16 (the activation format, :mod:`q2gemv.formats.act`); the
outputs have the activations' format:

1. **Special rows.** If any activation a_k of row m is NaN or +-Inf (exponent
   field all ones: 255 in bf16, 31 in fp16), every output of row m is NaN (bf16
   ``0x7FC0``, fp16 ``0x7E00``). If any block scale of weight row n
   is NaN or +-Inf (NVFP4: E4M3 ``0x7F``/``0xFF``), every output of column n
   is NaN. NVFP4: a non-finite global scale makes every output NaN.
2. **Fixed point.** ``E_m = max floor(log2 |a_k|)`` over the nonzero a_k of row
   m (subnormals by their value: steps of ``2**-133`` in bf16, ``2**-24`` in fp16);
   ``A_k = round_half_even(a_k * 2**(22 - E_m))``, an integer with ``|A_k| < 2**23``
   (at most ``255 * 2**15`` for bf16's 8 significant bits, ``2047 * 2**12 = 2**23 -
   2**12`` for fp16's 11). A row of zeros gives every ``A_k = 0``.
3. **Weights as exact values.** Q2_0: ``w[n, k] = (code - 1) * d_b`` with
   ``d_b`` the block's fp16 scale. NVFP4: ``w[n, k] = e2m1 * e4m3(s_b) * g``
   with ``s_b`` the scale of its 16-element block and ``g`` the fp32 global
   scale as ``Nvfp4Weight.global_scale`` holds it (a multiplier; a
   compressed-tensors divisor is converted to it once, at load).
4. **One rounding.** ``y[m, n]`` is the value of the activation format nearest
   (ties to even) to the exact ``sum_k w[n, k] * A_k * 2**(E_m - 22)``. Exact zero
   gives +0; a nonzero value that rounds to zero keeps its sign; beyond the
   format's range (the largest bf16 is ``(2 - 2**-7) * 2**127``, the largest fp16
   65504; fp16's smallest step ``2**-24``) gives +-Inf by the same rule.

Only step 2 and step 4 round. Step 2 is exact for activations of at least
``2**(E_m - 15)`` in bf16 and ``2**(E_m - 12)`` in fp16 (their 8 or 11 significant
bits fit above the fixed point); smaller ones lose low bits, and those of at most
``2**(E_m - 23)`` become 0. Error bound, per output, for either format:
``|y - x.w| <= 2**(E_m - 23) * sum_k |w_k| + half an ulp of y`` (an ulp of the
activation format), where ``x.w`` is the exact dot product of the original
activations with ``dequantize()``; the first term is at most ``2**-23`` relative to
``max_k |a_k| * sum_k |w_k|``.

Nothing here follows a kernel's order: the sums are exact integers (block
sums in float64, exact because every partial sum is an integer below
2**53; the scaled total in Python integers), so any order gives these bits.
NVFP4 in integers: ``2 * e2m1`` is an int in [-12, 12], ``e4m3 = mant *
2**exp`` with ``mant <= 15``, and ``g = gm * 2**ge`` with ``|gm| < 2**24``.
"""

from __future__ import annotations

import numpy as np

from ..formats.act import BF16, ActFormat, as_act_rows
from ..formats.nvfp4 import E2M1_TWICE, Nvfp4Weight
from ..formats.q2_0 import Q2Weight

FRAC_BITS = 22  # A_k = a_k * 2**(FRAC_BITS - E_m), rounded half to even
BF16_NAN = BF16.nan  # 0x7FC0
BF16_INF = BF16.inf  # 0x7F80
BF16_MIN_QUANTUM = BF16.min_quantum  # -133: the bf16 subnormal step is 2**-133
_ROW_ELEMS = 1 << 20  # elements of a chunk (activation or weight rows x K): bounds memory


def fixed_point(
    bits: np.ndarray, act: ActFormat = BF16
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Step 2 of the contract for bit rows ``bits`` (uint16 [M, K]) of format ``act``.

    Returns ``(A, E, special)``: ``A`` int64 [M, K] (``|A| < 2**23``), ``E``
    int64 [M] (0 for an all-zero row), ``special`` bool [M] (the row holds a
    NaN or an Inf; its ``A`` is all zero).
    """
    bits = np.asarray(bits, np.uint16)
    mb = act.mant_bits
    e = ((bits >> mb) & act.exp_max).astype(np.int64)
    f = (bits & ((1 << mb) - 1)).astype(np.int64)
    nonzero = (bits & 0x7FFF) != 0
    special = (e == act.exp_max).any(axis=1)
    # floor(log2 |a|): e - bias for normals, bit_length(f) - 1 + min_quantum for subnormals
    sub_lg = np.floor(np.log2(np.maximum(f, 1))).astype(np.int64) + act.min_quantum
    lg = np.where(e > 0, e - act.bias, sub_lg)
    big = np.iinfo(np.int64).min
    emax = np.where(nonzero, lg, big).max(axis=1, initial=big)
    E = np.where(emax == big, 0, emax)
    mant = np.where(e > 0, f | (1 << mb), f)
    # |a| = mant * 2**(max(e, 1) + min_quantum - 1), so |a| * 2**(22 - E) = mant * 2**s
    s = np.maximum(e, 1) + (act.min_quantum - 1 + FRAC_BITS) - E[:, None]
    up = mant << np.clip(s, 0, 23)  # s <= 23 - (mb + 1), or <= 22 in an all-subnormal row
    r = np.clip(-s, 1, mb + 3)  # >= mb + 3 dropped bits: mant < 2**(mb + 1) rounds to 0
    q = mant >> r
    rem = mant - (q << r)
    half = np.int64(1) << (r - 1)
    q = q + ((rem > half) | ((rem == half) & (q & 1 == 1)))
    A = np.where(s >= 0, up, q)
    A = np.where((bits & 0x8000) != 0, -A, A)
    A[special] = 0
    return A, E, special


def nearest_bits(v: int, p: int, act: ActFormat = BF16) -> int:
    """Bits (format ``act``) of the value nearest to ``v * 2**p`` (ints), ties to even (step 4).

    ``v == 0`` gives +0; a nonzero value that rounds to zero keeps its sign;
    values at or beyond the rounding boundary of the format's largest finite value give +-Inf.
    """
    v, p = int(v), int(p)
    if v == 0:
        return 0
    sign = 0x8000 if v < 0 else 0
    u = -v if v < 0 else v
    mb, qmin = act.mant_bits, act.min_quantum
    q = max(u.bit_length() - 1 + p - mb, qmin)  # exponent of the result's ulp
    r = q - p  # bits of u below that ulp
    if r <= 0:
        mant = u << -r
    else:
        mant = u >> r
        rem = u - (mant << r)
        half = 1 << (r - 1)
        if rem > half or (rem == half and mant & 1):
            mant += 1
    # mant = 2**(mb + 1) carries into the exponent field by itself; subnormals have q = qmin
    bits = ((q - qmin) << mb) + mant
    return sign | min(bits, act.inf)


def bf16_nearest(v: int, p: int) -> int:
    """bf16 bits of the value nearest to ``v * 2**p``: :func:`nearest_bits` for bf16."""
    return nearest_bits(v, p, BF16)


def exact_gemv(
    bits: np.ndarray,
    wint_rows,
    n: int,
    group: int,
    scale_mant: np.ndarray,
    scale_exp: np.ndarray,
    bad_col: np.ndarray,
    total_mant: int = 1,
    total_exp: int = 0,
    act: ActFormat = BF16,
) -> np.ndarray:
    """The contract for any weight family whose values are ``wint * mant_b * 2**exp_b * t``.

    Args:
        bits: activation bits of format ``act`` (default bf16), uint16 [M, K].
        wint_rows: ``wint_rows(r0, r1)`` -> the integer weight factors of rows
            r0..r1-1 as float64 [r1 - r0, K] (small integers, exact).
        n: weight rows; group: elements per scale block.
        scale_mant, scale_exp: int64 [N, K/group]: block b of row n scales
            by ``scale_mant * 2**scale_exp`` exactly (``scale_mant`` signed).
        bad_col: bool [N]: columns whose output is NaN.
        total_mant, total_exp: a factor ``t = total_mant * 2**total_exp``
            common to every weight (NVFP4's global scale), applied to the
            exact total.
        act: the activation format, also the output's.

    Returns uint16 bits [M, N] of format ``act``.
    """
    bits = np.asarray(bits, np.uint16)
    m, k = bits.shape
    out = np.empty((m, n), np.uint16)
    if m == 0 or n == 0:
        return out
    emin = int(scale_exp.min()) if scale_exp.size else 0
    m_per = max(1, _ROW_ELEMS // max(1, k))  # activation rows at once: memory does not grow with M
    for a0 in range(0, m, m_per):
        a1 = min(m, a0 + m_per)
        out[a0:a1] = _exact_rows(
            bits[a0:a1],
            wint_rows,
            n,
            group,
            scale_mant,
            scale_exp,
            bad_col,
            emin,
            (int(total_mant), int(total_exp)),
            act,
        )
    return out


def _exact_rows(
    bits, wint_rows, n, group, scale_mant, scale_exp, bad_col, emin, factor, act
) -> np.ndarray:
    """:func:`exact_gemv` for one chunk of activation rows.

    ``emin``: the weight's smallest exponent; ``factor``: ``(total_mant, total_exp)``.
    """
    A, E, special = fixed_point(bits, act)
    m, k = A.shape
    nb = k // group
    out = np.empty((m, n), np.uint16)
    rows_per = max(1, _ROW_ELEMS // max(1, k * m))
    a_blocks = A.reshape(m, nb, group).transpose(1, 0, 2).astype(np.float64)  # [nb, M, g]
    nearest = np.frompyfunc(lambda v, p: nearest_bits(v, p, act), 2, 1)
    for r0 in range(0, n, rows_per):
        r1 = min(n, r0 + rows_per)
        w = np.asarray(wint_rows(r0, r1), np.float64).reshape(r1 - r0, nb, group)
        # exact: |partial sums| < 2**53 (|w| <= 12, |A| < 2**23, group <= 128)
        s = np.matmul(a_blocks, w.transpose(1, 2, 0))  # [nb, M, rows]
        s = s.astype(np.int64).transpose(1, 2, 0) * scale_mant[r0:r1][None]  # [M, rows, nb]
        sh = scale_exp[r0:r1] - emin
        total = np.zeros((m, r1 - r0), object)
        for e_ in np.unique(sh):
            part = np.where(sh[None] == e_, s, 0).sum(axis=2)  # int64: < 2**42 * nb
            total += part.astype(object) * (1 << int(e_))
        total *= factor[0]
        p = (E - FRAC_BITS + emin + factor[1])[:, None]
        y = nearest(total, np.broadcast_to(p, total.shape)).astype(np.uint16)
        y[:, bad_col[r0:r1]] = act.nan
        out[:, r0:r1] = y
    out[special] = act.nan
    return out


def fp16_scale_parts(h: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """fp16 bits -> ``(signed mantissa, exponent, non-finite)``: value = mant * 2**exp exactly."""
    h = np.asarray(h, np.uint16).astype(np.int64)
    e = (h >> 10) & 31
    f = h & 1023
    mant = np.where(e > 0, f | 1024, f)
    mant = np.where(h & 0x8000, -mant, mant)
    return mant, np.maximum(e, 1) - 25, e == 31


def q2_0_gemv_exact(a, weight: Q2Weight) -> np.ndarray:
    """``y = a @ dequantize(weight).T`` under the exact contract (module docstring).

    Args:
        a: activations [K] or [M, K], ``ml_dtypes.bfloat16`` or ``np.float16``.
        weight: a :class:`~q2gemv.Q2Weight`.

    Returns [M, N] ([N] for 1-D ``a``) in the dtype of ``a``. Raises TypeError/ValueError
    naming the argument.
    """
    if not isinstance(weight, Q2Weight):
        raise TypeError(f"weight: expected a Q2Weight, got {type(weight).__name__}")
    bits, squeeze, act = as_act_rows(a, weight.k)
    scales = weight.scales().view(np.uint16)
    mant, exp, bad = fp16_scale_parts(scales)
    codes = weight.codes()

    def wint_rows(r0: int, r1: int) -> np.ndarray:
        return codes[r0:r1].astype(np.float64) - 1.0

    y = exact_gemv(bits, wint_rows, weight.n, weight.group, mant, exp, bad.any(axis=1), act=act)
    out = act.from_bits(y)
    return out[0] if squeeze else out


def e4m3_scale_parts(b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """E4M3-fn bits -> ``(signed mantissa, exponent, NaN)``: value = mant * 2**exp exactly."""
    b = np.asarray(b, np.uint8).astype(np.int64)
    e = (b >> 3) & 15
    f = b & 7
    mant = np.where(e > 0, f | 8, f)
    mant = np.where(b & 0x80, -mant, mant)
    return mant, np.maximum(e, 1) - 10, (b & 0x7F) == 0x7F


def f32_parts(g: float) -> tuple[int, int, bool]:
    """fp32 ``g`` -> ``(mant, exp, finite)`` with ``g = mant * 2**exp`` exactly (``|mant| < 2**24``)."""
    bits = int(np.float32(g).view(np.uint32))
    e = (bits >> 23) & 0xFF
    f = bits & 0x7FFFFF
    mant = f | 0x800000 if e else f
    return (-mant if bits >> 31 else mant), max(e, 1) - 150, e != 0xFF


def w4a16_gemv_exact(a, weight: Nvfp4Weight) -> np.ndarray:
    """``y = a @ dequantize(weight).T`` under the exact contract (module docstring).

    Args:
        a: activations [K] or [M, K], ``ml_dtypes.bfloat16`` or ``np.float16``.
        weight: an :class:`~q2gemv.Nvfp4Weight`.

    Returns [M, N] ([N] for 1-D ``a``) in the dtype of ``a``. Raises TypeError/ValueError
    naming the argument.
    """
    if not isinstance(weight, Nvfp4Weight):
        raise TypeError(f"weight: expected an Nvfp4Weight, got {type(weight).__name__}")
    bits, squeeze, act = as_act_rows(a, weight.k)
    mant, exp, bad = e4m3_scale_parts(weight.scales)
    gm, ge, finite = f32_parts(weight.global_scale)
    codes = weight.codes()

    def wint_rows(r0: int, r1: int) -> np.ndarray:
        return E2M1_TWICE[codes[r0:r1]].astype(np.float64)

    # the weight is (2 * e2m1) * mant * 2**exp * gm * 2**ge / 2
    y = exact_gemv(bits, wint_rows, weight.n, 16, mant, exp, bad.any(axis=1), gm, ge - 1, act)
    if not finite:
        y[:] = act.nan
    out = act.from_bits(y)
    return out[0] if squeeze else out
