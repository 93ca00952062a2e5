"""The deterministic input generator of the golden suite (version :data:`GENERATOR_VERSION`).

Every generated input is a pure function of a text label and of the rules
below: integer arithmetic only, no floating-point library call, no NumPy
``Generator`` (whose streams NumPy may change between releases). So any
machine regenerates the same bytes, and the real-model shapes (too big to
ship) are stored as labels + parameters and rebuilt on load; their sha256 is
stored to catch drift.

Random stream of a label (SplitMix64 as a counter stream)::

    seed(label) = little-endian uint64 of sha256(label.encode("utf-8"))[:8]
    word(i)     = mix(seed + (i + 1) * 0x9E3779B97F4A7C15)       (mod 2^64)
    mix(z)      = z ^= z >> 30; z *= 0xBF58476D1CE4E5B9;
                  z ^= z >> 27; z *= 0x94D049BB133111EB; z ^= z >> 31

``fields(label, count, width)`` cuts the words into ``width``-bit unsigned
fields, least-significant first (64 / width fields a word; width divides 64).

Values built from fields (all exact bit constructions):

* Q2_0 codes, ``uniform``: 2-bit fields (codes 0..3, code 3 included);
  ``ternary``: 2-bit field f -> code (0, 1, 2, 1)[f] (half the weights 0).
* fp16 scale bits (16-bit field f): mantissa f & 0x3FF, exponent field
  ``E_LO + ((f >> 10) & 31) % (E_HI - E_LO + 1)``, sign bit f >> 15 (or 0
  for positive-only kinds).
* bf16 activation bits: the same construction with a 7-bit mantissa
  (f & 0x7F), exponent field ``E_LO + ((f >> 7) & 0xFF) % (E_HI - E_LO + 1)``,
  sign bit f >> 15.
* fp16 activation bits (the ``*_fp16`` families): the fp16 scale construction with the
  activation kinds of :func:`activations_fp16`.
* NVFP4 nibbles: 4-bit fields (all 16 codes, -0 included); E4M3 scale bytes:
  8-bit field f -> ``S_LO + f % (S_HI - S_LO + 1)``.

The suite itself (which shapes, kinds and kernels; which checks are small
enough for the CUDA simulator) is :func:`gemv_specs` and :func:`model_specs`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..dispatch import registry
from ..formats import q2_0 as q2fmt
from ..formats.act import BF16, FP16, ActFormat
from ..formats.bf16 import BF16_MAX
from ..formats.nvfp4 import BLOCK as NVFP4_BLOCK
from ..formats.nvfp4 import Nvfp4Weight

GENERATOR_VERSION = 1
FORMAT_VERSION = 1

_GAMMA = np.uint64(0x9E3779B97F4A7C15)
_C1 = np.uint64(0xBF58476D1CE4E5B9)
_C2 = np.uint64(0x94D049BB133111EB)

# -- kernels the suite covers, with rows served per launch (launch wrappers chunk beyond) ----
# All from the registry (q2gemv.dispatch.registry): one family per (format, contract) with golden=True;
# a new family is a new expected file gemv_<family>.npz (golden.suite.expected_files).
FAMILY_KERNELS: dict[str, tuple[str, ...]] = registry.golden_families()
Q2_KERNELS = FAMILY_KERNELS["q2_0"]
W4A16_KERNELS = FAMILY_KERNELS["w4a16"]
# The exact contract (q2gemv.reference.exact): its own families, so its own files
# gemv_q2_0_exact.npz and gemv_w4a16_exact.npz.
EXACT_KERNELS = FAMILY_KERNELS["q2_0_exact"]
W4_EXACT_KERNELS = FAMILY_KERNELS["w4a16_exact"]
# fp16 activations under the exact contract: the same kernels, their own families and files
# (gemv_q2_0_exact_fp16.npz, gemv_w4a16_exact_fp16.npz), so the bf16 files stay as they are.
FP16_SUFFIX = "_fp16"
FP16_FAMILIES = {f"{fam}{FP16_SUFFIX}": fam for fam in ("q2_0_exact", "w4a16_exact")}
FAMILY_KERNELS.update({f16: FAMILY_KERNELS[fam] for f16, fam in FP16_FAMILIES.items()})
# The weight format each family's cases are built in (inputs, ids, labels).
FAMILY_FORMAT = {fam: registry.get(names[0]).family for fam, names in FAMILY_KERNELS.items()}
# Rows per launch: the M=1 Q2_0 kernels launch once per activation row; q2_0_gemv_exact:
# the launcher's chunks, after one exact_prepare.
MAX_M = {name: registry.get(name).max_m for names in FAMILY_KERNELS.values() for name in names}
KERNELS = Q2_KERNELS + W4A16_KERNELS + EXACT_KERNELS + W4_EXACT_KERNELS
# Activation codes staged per shared-memory tile (the K seams the shapes cross).
Q2_TILE_M1 = 8192  # q2_0_gemv_vec, q2_0_gemv_vec_rt4
Q2_TILE_BATCHM = 1024  # q2_0_gemv_vec_batchm, q2_0_gemv_vec_batchm_rt2 (at M = 6..8 since v4)
W4A16_TILE = 512
M_SWEEP = (0, 1, 2, 4, 5, 7, 8, 9, 16, 17, 32, 33)
N_SWEEP = (1, 7, 8, 9, 33)


def weight_format(family: str) -> str:
    """``"q2_0"`` or ``"w4a16"``: the weight format of ``family``'s cases."""
    return FAMILY_FORMAT[family]


def act_format(family: str) -> ActFormat:
    """The activation (and output) format of ``family``'s cases: fp16 for the ``*_fp16``
    families, else bf16."""
    return FP16 if family in FP16_FAMILIES else BF16


def grouped(family: str) -> bool:
    """Whether ``family``'s weights carry a group (:attr:`q2gemv.dispatch.registry.FamilySpec.grouped`).

    A grouped family's case ids and weight labels name the group.
    """
    return registry.family(weight_format(family)).grouped


def family_of(kernel: str) -> str:
    for fam, names in FAMILY_KERNELS.items():
        if kernel in names:
            return fam
    raise ValueError(f"kernel: expected one of {KERNELS}, got {kernel!r}")


# -- the random stream -------------------------------------------------------------------


def stream_seed(label: str) -> int:
    return int.from_bytes(hashlib.sha256(label.encode("utf-8")).digest()[:8], "little")


def words(label: str, count: int) -> np.ndarray:
    """``count`` uint64 words of the SplitMix64 counter stream of ``label``."""
    with np.errstate(over="ignore"):
        i = np.arange(1, count + 1, dtype=np.uint64)
        z = np.uint64(stream_seed(label)) + i * _GAMMA
        z = (z ^ (z >> np.uint64(30))) * _C1
        z = (z ^ (z >> np.uint64(27))) * _C2
        return z ^ (z >> np.uint64(31))


def fields(label: str, count: int, width: int) -> np.ndarray:
    """``count`` unsigned ``width``-bit fields (uint64), LSB-first within each word."""
    if 64 % width:
        raise ValueError(f"width: expected a divisor of 64, got {width}")
    per = 64 // width
    w = words(label, -(-count // per))
    shifts = np.arange(per, dtype=np.uint64) * np.uint64(width)
    mask = np.uint64((1 << width) - 1)
    return ((w[:, None] >> shifts) & mask).reshape(-1)[:count]


def _float_bits(f, mant_bits, e_lo, e_hi, signed):
    """16-bit float patterns from 16-bit fields: mantissa, exponent index, sign (see above)."""
    span = np.uint64(e_hi - e_lo + 1)
    exp_mask = np.uint64((1 << (15 - mant_bits)) - 1)
    mant = f & np.uint64((1 << mant_bits) - 1)
    exp = np.uint64(e_lo) + ((f >> np.uint64(mant_bits)) & exp_mask) % span
    sign = (f >> np.uint64(15)) if signed else np.uint64(0)
    return ((sign << np.uint64(15)) | (exp << np.uint64(mant_bits)) | mant).astype(np.uint16)


def fp16_bits(label, count, e_lo=7, e_hi=11, signed=True) -> np.ndarray:
    """fp16 bit patterns, exponent field in [e_lo, e_hi] (default: |d| in [2^-8, 2^-3))."""
    return _float_bits(fields(label, count, 16), 10, e_lo, e_hi, signed)


def bf16_bits(label, count, e_lo=123, e_hi=129, signed=True) -> np.ndarray:
    """bf16 bit patterns, exponent field in [e_lo, e_hi] (default: |a| in [2^-4, 2^3))."""
    return _float_bits(fields(label, count, 16), 7, e_lo, e_hi, signed)


# -- weights --------------------------------------------------------------------------

# fp16 scale patterns the "special_d" Q2_0 weight cycles through, block by block.
Q2_SPECIAL_D = (
    0x0000,  # +0
    0x8000,  # -0
    0x0001,  # smallest subnormal 2^-24
    0x03FF,  # largest subnormal
    0x0400,  # smallest normal 2^-14
    0x7BFF,  # max 65504
    0xFBFF,  # -65504
    0x7C00,  # +Inf
    0xFC00,  # -Inf
    0x7E00,  # NaN
    0x3C00,  # 1.0
    0xAE66,  # -0.1 (rounded)
)
# E4M3 scale bytes the "special_s" NVFP4 weight cycles through, group by group.
W4_SPECIAL_S = (
    0x00,  # +0
    0x80,  # -0
    0x01,  # smallest subnormal 2^-9
    0x07,  # largest subnormal
    0x08,  # smallest normal 2^-6
    0x7E,  # max 448
    0xFE,  # -448
    0x7F,  # NaN
    0xFF,  # NaN
    0x38,  # 1.0
    0xB5,  # -0.8125
)
W4_DEFAULT_G = 0x3C400000  # fp32 0.01171875 = 1.5 * 2^-7: a multiply that rounds
W4_GSCALE = {
    "uniform": W4_DEFAULT_G,
    "special_s": 0x3F800000,  # 1.0
    "gscale_tiny": 0x00C00000,  # 1.5 * 2^-126 -> outputs deep in the fp32 subnormals
    "gscale_huge": 0x7E800000,  # 2^126 -> outputs overflow to +-Inf
}
Q2_WEIGHT_KINDS = ("uniform", "ternary", "special_d", "code3")
W4_WEIGHT_KINDS = tuple(W4_GSCALE)
EXACT_WEIGHT_KINDS = Q2_WEIGHT_KINDS + ("boundary",)
# The NVFP4 exact family's weights add: every non-NaN E4M3 byte (the accumulator's whole shift
# range), only subnormal scales, zero scales, and global scales that are negative, zero,
# subnormal, NaN or Inf; "boundary" is the Q2_0 boundary weight in E2M1 (code 2 = 1.0,
# code 10 = -1.0, code 0 elsewhere), scaled by W4_BOUNDARY_S with g = 1.
W4_EXACT_GSCALE = {
    "all_s": 0x3F800000,
    "subnormal_s": 0x3F800000,
    "zero_s": W4_DEFAULT_G,
    "gscale_neg": 0xBC400000,  # -1.5 * 2^-7
    "gscale_zero": 0x00000000,
    "gscale_sub": 0x00000003,  # 3 * 2^-149: an fp32 subnormal global scale
    "gscale_nan": 0x7FC00000,
    "gscale_inf": 0xFF800000,
    "boundary": 0x3F800000,
}
W4_EXACT_WEIGHT_KINDS = W4_WEIGHT_KINDS + tuple(W4_EXACT_GSCALE)
W4_BOUNDARY_S = (0x38, 0x01, 0x70)  # E4M3 1.0, 2^-9 (subnormal), 2^7

# The "boundary" weight and activations (exact contract): activation row r holds the pieces
# BOUNDARY_PIECES[j] * 2**e_r at positions 16 w_r + j of one 16-position window w_r, +0 elsewhere;
# weight row n selects BOUNDARY_SUBSETS[n % 12] of the pieces in every window (code 2, or code 0
# for the negated rows), so y[r, n] = +-d_n * 2**e_r * (sum of the subset) exactly, a value
# chosen to sit on or next to a bf16 rounding boundary.
BOUNDARY_PIECES = (0, -1, -2, -3, -4, -5, -6, -7, -8, -16, "-16", -9)  # 2**p; "-16": -2**-16
BOUNDARY_SUBSETS = (
    (0,),  # 1: exact
    (0, 8),  # 1 + 2**-8: a tie, even below: rounds down
    (0, 7, 8),  # 1 + 2**-7 + 2**-8: a tie, odd below: rounds up
    (0, 8, 9),  # just above the tie: up
    (0, 8, 10),  # just below the tie: down
    (0, 1, 2, 3, 4, 5, 6, 7),  # 2 - 2**-7: the largest mantissa
    (0, 1, 2, 3, 4, 5, 6, 7, 8),  # 2 - 2**-8: a tie into the next binade (+-Inf at the top)
    (0, 1, 2, 3, 4, 5, 6, 7, 8, 10),  # just below that tie
    (8,),  # a lone small piece
    (9, 10),  # cancels exactly: +0 (also for the negated rows)
    (),  # nothing: +0
    (0, 11),  # a quarter ulp: down
)
# fp16 scales of the weight rows, per 24 rows (12 subsets x 2 signs): 1, 2**-24 (the smallest
# subnormal: outputs in the bf16 subnormals and below), 2**15 (outputs beyond the bf16 range).
BOUNDARY_D = (0x3C00, 0x0001, 0x7800)
# e_r of the activation rows: with the scales above they reach normal ties (0, 9), fp16-scaled
# normals (-100), bf16 subnormal outputs (-104, -109), half the smallest subnormal (-110: ties to
# +-0), values below that (-117: +-0 with their sign), the largest finite bf16 and overflow
# (112, 127). e >= -117 keeps every piece (down to 2**(e - 16)) an exact bf16.
BOUNDARY_E = (0, -100, -104, -109, -110, 112, 127, -117, 9)
BOUNDARY_WINDOW = 16


def q2_weight(label: str, kind: str, n: int, k: int, group: int) -> np.ndarray:
    """Raw ``block_q2_0`` bytes [n * k/group * (2 + group/4)] of a weight of ``kind``.

    uniform: codes 0..3, signed scales; ternary: codes 0..2, positive scales;
    special_d: uniform codes, block b of row r (row-major block index i =
    r * k/group + b) takes scale ``Q2_SPECIAL_D[i % 12]``; code3: every code 3
    (+2), positive scales.
    """
    nb = k // group
    f = fields(label + "/codes", n * k, 2).astype(np.uint8)
    if kind == "uniform":
        codes, d = f, fp16_bits(label + "/d", n * nb)
    elif kind == "ternary":
        codes = np.array([0, 1, 2, 1], np.uint8)[f]
        d = fp16_bits(label + "/d", n * nb, signed=False)
    elif kind == "special_d":
        codes = f
        d = np.array(Q2_SPECIAL_D, np.uint16)[np.arange(n * nb) % len(Q2_SPECIAL_D)]
    elif kind == "code3":
        codes = np.full(n * k, 3, np.uint8)
        d = fp16_bits(label + "/d", n * nb, signed=False)
    elif kind == "boundary":
        codes, d = _boundary_weight(n, k, nb)
    else:
        raise ValueError(f"kind: expected one of {EXACT_WEIGHT_KINDS}, got {kind!r}")
    return q2fmt.pack(codes.reshape(n, k), d.view(np.float16).reshape(n, nb), group)


def _boundary_weight(n: int, k: int, nb: int) -> tuple[np.ndarray, np.ndarray]:
    """Codes [n * k] and fp16 scale bits [n * nb] of the "boundary" weight (see BOUNDARY_*)."""
    codes = np.ones((n, k), np.uint8)  # code 1: weight 0
    pos = np.arange(k) % BOUNDARY_WINDOW
    ns = len(BOUNDARY_SUBSETS)
    for r in range(n):
        sel = np.isin(pos, BOUNDARY_SUBSETS[r % ns])
        codes[r, sel] = 0 if (r // ns) % 2 else 2
    d = np.array([BOUNDARY_D[(r // (2 * ns)) % len(BOUNDARY_D)] for r in range(n)], np.uint16)
    return codes.reshape(-1), np.repeat(d, nb)


def _pow2_bf16(p: int, negative: bool = False) -> int:
    """bf16 bits of +-2**p (p in -133..127: normal or subnormal, exact)."""
    bits = (p + 127) << 7 if p >= -126 else 1 << (p + 133)
    return bits | (0x8000 if negative else 0)


def w4_weight(label: str, kind: str, n: int, k: int) -> tuple[np.ndarray, np.ndarray, int]:
    """(packed uint8 [n, k/2], E4M3 scale bytes uint8 [n, k/16], fp32 bits of g) of ``kind``.

    Nibbles are uniform 4-bit fields for every kind but ``boundary``; scale
    bytes are uniform in [0x28, 0x47] (0.25 .. 1.875 * 2^1) except
    ``special_s``, where group i (row-major) takes ``W4_SPECIAL_S[i % 11]``;
    ``all_s``: group i takes the i-th of the 254 non-NaN bytes, from a
    stream offset; ``subnormal_s``: bytes 0x01..0x07 / 0x81..0x87;
    ``zero_s``: +0 and -0. ``g`` is ``W4_GSCALE[kind]`` or
    ``W4_EXACT_GSCALE[kind]``. ``boundary``: see ``W4_EXACT_GSCALE``.
    """
    g = W4_GSCALE.get(kind, W4_EXACT_GSCALE.get(kind))
    if g is None:
        raise ValueError(f"kind: expected one of {W4_EXACT_WEIGHT_KINDS}, got {kind!r}")
    nib = fields(label + "/codes", n * k, 4).astype(np.uint8).reshape(n, k)
    ng = n * (k // NVFP4_BLOCK)
    f = fields(label + "/s", ng, 8)
    if kind == "special_s":
        s = np.array(W4_SPECIAL_S, np.uint8)[np.arange(ng) % len(W4_SPECIAL_S)]
    elif kind == "all_s":
        finite = np.array([b for b in range(256) if b & 0x7F != 0x7F], np.uint8)
        s = finite[(np.arange(ng) + int(f[0])) % finite.size]
    elif kind == "subnormal_s":
        s = (1 + f % 7 + (f & 0x80)).astype(np.uint8)
    elif kind == "zero_s":
        s = (f & 0x80).astype(np.uint8)
    elif kind == "boundary":
        codes, srow = _boundary_weight(n, k, 1)  # code 0 / 1 / 2: weight -1 / 0 / +1 x d
        nib = np.array([10, 0, 2], np.uint8)[codes].reshape(n, k)  # E2M1 -1.0, 0, 1.0
        rows = np.arange(n) // (2 * len(BOUNDARY_SUBSETS))
        s = np.repeat(np.array(W4_BOUNDARY_S, np.uint8)[rows % len(W4_BOUNDARY_S)], k // 16)
        del srow
    else:
        s = (0x28 + f % 0x20).astype(np.uint8)
    packed = nib[:, 0::2] | (nib[:, 1::2] << 4)
    return packed, s.reshape(n, k // NVFP4_BLOCK), g


# -- activations ------------------------------------------------------------------------

ACT_KINDS = ("normal", "zeros", "negzero", "inf", "nan", "subnormal", "max", "cancel")
# The exact contract's cases add: rounding boundaries (with the "boundary" weight) and outliers
# (3 elements of a normal row scaled by 2**10 ~ 1000x, or by 2**30, where the small elements
# lose bits in the contract's fixed point: A_k rounds, ties included).
EXACT_ACT_KINDS = ACT_KINDS + ("boundary", "outlier", "outlier_huge")


@dataclass(frozen=True)
class _Specials:
    """A format's bit patterns for the activation kinds bf16 and fp16 share (:func:`_shared_row`)."""

    pos_inf: int
    neg_inf: int
    nan: int  # the NaN of even rows (odd rows: 0xFFFF)
    mant_mask: int  # the mantissa field: a subnormal is sign | (1 .. mant_mask)
    max: int  # the largest finite value
    exp_shift: int  # the exponent field's lowest bit


_BF16_SPECIALS = _Specials(0x7F80, 0xFF80, 0x7FC1, 0x7F, BF16_MAX, 7)
_OUTLIER_SHIFT = {"outlier": 10, "outlier_huge": 30}


def _shared_row(row, lab: str, r: int, kind: str, sp: _Specials) -> np.ndarray | None:
    """Row ``r`` of a kind both formats' activations have, made from the normal row ``row``
    (changed in place or replaced); None for a kind of one format only.

    normal: as it is. zeros: +0. negzero: -0. inf: +Inf at position p and -Inf at q (p, q
    from the stream, p != q; rows with r odd: +Inf only). nan: one NaN (``sp.nan`` for even
    r, 0xFFFF for odd r). subnormal: every element a subnormal (exponent 0, mantissa != 0).
    max: +max at k % 4 == 0 positions of the first half, -max at k % 4 == 2 of the second
    half (sums overflow and cancel). outlier / outlier_huge: up to 3 elements (positions
    from the stream) scaled by 2^10 / 2^30 (exponent field raised).
    """
    k = row.shape[0]
    if kind == "normal":
        return row
    if kind in ("zeros", "negzero"):
        row[:] = 0x0000 if kind == "zeros" else 0x8000
    elif kind == "inf":
        p, q = (int(x) % k for x in fields(lab + "/pos", 2, 32))
        row[p] = sp.pos_inf
        if r % 2 == 0 and k > 1:
            row[q if q != p else (p + 1) % k] = sp.neg_inf
    elif kind == "nan":
        p = int(fields(lab + "/pos", 1, 32)[0]) % k
        row[p] = sp.nan if r % 2 == 0 else 0xFFFF
    elif kind == "subnormal":
        f = fields(lab + "/sub", k, 16)
        mask = np.uint64(sp.mant_mask)
        return ((f & np.uint64(0x8000)) | (1 + (f & mask) % mask)).astype(np.uint16)
    elif kind == "max":
        j = np.arange(k)
        row[(j % 4 == 0) & (j < k // 2)] = sp.max
        row[(j % 4 == 2) & (j >= k // 2)] = sp.max | 0x8000
    elif kind in _OUTLIER_SHIFT:
        for p in sorted({int(x) % k for x in fields(lab + "/outliers", 3, 32)}):
            row[p] += np.uint16(_OUTLIER_SHIFT[kind] << sp.exp_shift)  # |a| * 2**shift
    else:
        return None
    return row


def activations(label: str, kind: str, m: int, k: int) -> np.ndarray:
    """bf16 bits uint16 [m, k] of ``kind``; row r is built from label + f"/r{r}".

    normal: |a| in [2^-4, 2^3), random signs. zeros: +0. negzero: -0.
    inf: a normal row with +Inf at position p and -Inf at position q (p, q
    from the stream, p != q; rows with r odd have only the +Inf).
    nan: a normal row with one NaN (0x7FC1 for even r, 0xFFFF for odd r).
    subnormal: every element a bf16 subnormal (exponent 0, mantissa != 0).
    max: a normal row with +max (0x7F7F) at k % 4 == 0 positions of the first
    half and -max at k % 4 == 2 of the second half (sums overflow and cancel).
    cancel: a huge/tiny mix: element j < k/2 is H_j (|H| ~ 2^40) when j % 3
    == 0, and element j + k/2 is -H_j, so the huge terms cancel exactly in
    the exact sum; the rest is normal (j % 3 == 1) or tiny (|a| ~ 2^-40,
    j % 3 == 2). The result keeps only what the fp32 addition order keeps.
    boundary: pieces +-2^(e_r + p) in one window, +0 elsewhere (see
    ``BOUNDARY_PIECES``; for the "boundary" weight).
    outlier / outlier_huge: a normal row with up to 3 elements (positions
    from the stream) scaled by 2^10 / 2^30 (exponent field raised).
    """
    out = np.empty((m, k), np.uint16)
    for r in range(m):
        lab = f"{label}/r{r}"
        row = bf16_bits(lab + "/normal", k)
        shared = _shared_row(row, lab, r, kind, _BF16_SPECIALS) if kind in EXACT_ACT_KINDS else None
        if shared is not None:
            row = shared
        elif kind == "cancel":
            half = k // 2
            j = np.arange(half)
            huge = bf16_bits(lab + "/huge", half, 127 + 38, 127 + 42)
            tiny = bf16_bits(lab + "/tiny", k, 127 - 42, 127 - 38)
            row = np.where(np.arange(k) % 3 == 2, tiny, row).astype(np.uint16)
            sel = j % 3 == 0
            row[:half][sel] = huge[sel]
            row[half : 2 * half][sel] = huge[sel] ^ np.uint16(0x8000)
        elif kind == "boundary":
            e = BOUNDARY_E[r % len(BOUNDARY_E)]
            w0 = BOUNDARY_WINDOW * ((5 * r) % max(1, k // BOUNDARY_WINDOW))
            row[:] = 0x0000
            for j, p in enumerate(BOUNDARY_PIECES):
                if w0 + j < k:
                    row[w0 + j] = _pow2_bf16(e + int(p), negative=isinstance(p, str))
        else:
            raise ValueError(f"kind: expected one of {EXACT_ACT_KINDS}, got {kind!r}")
        out[r] = row
    return out


# -- the suite ---------------------------------------------------------------------------


@dataclass(frozen=True)
class GemvSpec:
    """One GEMV case: a weight, an activation matrix and the kernels that must reproduce it.

    ``small`` is the subset of ``kernels`` the CUDA simulator runs (the others
    are reference + GPU only). ``group`` is 0 for NVFP4.
    """

    id: str
    family: str
    n: int
    k: int
    m: int
    weight_kind: str
    act_kind: str
    group: int = 0
    kernels: tuple[str, ...] = ()
    small: tuple[str, ...] = ()
    size: str = "medium"  # size class of the checks not in ``small``

    @property
    def weight_label(self) -> str:
        g = f"/g{self.group}" if grouped(self.family) else ""
        return f"v{GENERATOR_VERSION}/{self.family}{g}/w/{self.weight_kind}/{self.n}x{self.k}"

    @property
    def act_label(self) -> str:
        act = "act" if act_format(self.family) == BF16 else "act_fp16"
        return f"v{GENERATOR_VERSION}/{act}/{self.act_kind}/{self.m}x{self.k}"

    def size_of(self, kernel: str) -> str:
        return "small" if kernel in self.small else self.size


def _case_id(fam, g, n, k, m, wk, ak):
    gpart = f"/g{g}" if grouped(fam) else ""
    return f"{fam}{gpart}/n{n}_k{k}_m{m}/{wk}/{ak}"


# M values of the M sweep run on the simulator: 0, 2 and both sides of the kernel's
# width where that is affordable (simulator cost: docs/design_notes.md); the wide tiers
# run M=17 only (one launch of 17 rows on batch32, 16+1 on batch16). All M run on the
# reference and the GPU.
_SIM_M = {"w4a16_gemv_batch16": (0, 2, 17), "w4a16_gemv_batch32": (0, 2, 17)}


def _sim_m(kernel: str) -> tuple[int, ...]:
    """M values of the M sweep that ``kernel`` runs on the simulator."""
    w = MAX_M[kernel]
    return _SIM_M.get(kernel, (0, 2) if w == 1 else (0, 2, w, w + 1))


def gemv_specs() -> list[GemvSpec]:
    """Every small/medium GEMV case of the suite, in a fixed order (see the module docs)."""
    specs: dict[str, GemvSpec] = {}

    def add(fam, n, k, m, wk, ak, small, g=0):
        """Add a case; a case already added (same id) gains the new small kernels."""
        kernels = FAMILY_KERNELS[fam]
        cid = _case_id(fam, g, n, k, m, wk, ak)
        if cid in specs:
            small = set(small) | set(specs[cid].small)
        small = tuple(x for x in kernels if x in small)
        specs[cid] = GemvSpec(cid, fam, n, k, m, wk, ak, g, kernels, small)

    q2b, q2v, q2m, rt4, mrt2 = Q2_KERNELS
    core = (q2b, q2v, q2m)  # the seed's three kernels; rt4/mrt2 are register-tiled candidates
    w4 = W4A16_KERNELS
    b4, b8, rt2, b16, b32 = w4[0], w4[4], w4[5], w4[6], w4[7]

    # Q2_0, per group: shapes (one block, three, and one block past 1024 and 8192 codes:
    # the activation tiles the batched kernels staged at every M, and the M=1 kernels,
    # when this suite was made. Since v4 the batched kernels are built per M and stage
    # q2gemv.cuda.q2_0.seed.tile_k(M) codes a tile (1024 at M = 6..8); tests/cuda/q2_0/test_seed.py
    # crosses those seams. The vectors do not depend on tiles.)
    for g in q2fmt.GROUPS:
        for k in (g, 3 * g, Q2_TILE_BATCHM + g, Q2_TILE_M1 + g):
            for n in N_SWEEP:
                small: tuple[str, ...] = ()
                if k == g:
                    small = core if (n < 33 or g == 128) else ()
                    if n == 9 or (g == 128 and n in (1, 33)):
                        small += (rt4, mrt2)
                elif k == Q2_TILE_BATCHM + g and n == 8 and g == 128:
                    small = (q2m, mrt2)
                elif k == Q2_TILE_M1 + g and n == 1:
                    small = (q2v, rt4) if g == 128 else (q2v,)
                add("q2_0", n, k, 1, "uniform", "normal", small, g)
        # M sweep: every kernel over every M (M=1 kernels: one launch per row). On the
        # simulator batchm's chunk seam (M=9: 8 + 1) runs for group 128, M=8 for 64.
        for m in M_SWEEP:
            if g == 128:
                small = tuple(x for x in Q2_KERNELS if m in _sim_m(x) and (x, m) != (mrt2, 8))
            else:
                small = (q2m,) if m in (0, 2, 8) else ()
            add("q2_0", 7, 3 * g, m, "uniform", "normal", small, g)
        # special activations, one row each (two for inf/nan: their rows differ)
        for ak in ACT_KINDS[1:]:
            m = 2 if ak in ("inf", "nan") else 1
            small = core if g == 128 else (q2m,)
            if g == 128 and ak in ("inf", "nan", "max", "cancel"):
                small += (rt4, mrt2)
            add("q2_0", 7, 3 * g, m, "uniform", ak, small, g)
        # special weights
        for wk in Q2_WEIGHT_KINDS[1:]:
            small = Q2_KERNELS if wk == "special_d" else ((q2m,) if g == 128 else ())
            add("q2_0", 9, 2 * g, 1, wk, "normal", small, g)
        add("q2_0", 9, 2 * g, 2, "special_d", "max", (), g)
        add("q2_0", 9, 2 * g, 2, "code3", "max", (q2m,) if g == 64 else (), g)

    # NVFP4: shapes (one group, three, and 33 groups = two 512-element tiles).
    for k in (NVFP4_BLOCK, 3 * NVFP4_BLOCK, W4A16_TILE + NVFP4_BLOCK):
        for n in N_SWEEP:
            if k == NVFP4_BLOCK and n in (1, 9):
                small = w4
            elif k == 3 * NVFP4_BLOCK and n in (7, 8, 33):
                small = (b4, rt2, b32)
            elif k == W4A16_TILE + NVFP4_BLOCK and n == 9:
                small = w4
            else:
                small = ()
            add("w4a16", n, k, 1, "uniform", "normal", small)
    for m in M_SWEEP:
        add("w4a16", 7, 3 * NVFP4_BLOCK, m, "uniform", "normal", [x for x in w4 if m in _sim_m(x)])
    for m in (5, 17, 33):  # many rows across the tile seam
        add("w4a16", 7, W4A16_TILE + NVFP4_BLOCK, m, "uniform", "normal", ())
    for ak in ACT_KINDS[1:]:
        m = 2 if ak in ("inf", "nan") else 1
        small = (b4,) + ((rt2, b32) if ak in ("inf", "nan", "max", "cancel") else ())
        add("w4a16", 7, W4A16_TILE + NVFP4_BLOCK, m, "uniform", ak, small)
    for wk in W4_WEIGHT_KINDS[1:]:
        small = (b4, b8, rt2, b16, b32) if wk == "special_s" else (b4,)
        add("w4a16", 7, 3 * NVFP4_BLOCK, 1, wk, "normal", small)
    add("w4a16", 7, 3 * NVFP4_BLOCK, 2, "special_s", "max", (rt2,))
    _exact_specs(add)
    _exact_nvfp4_specs(add)
    _fp16_specs(add)
    return list(specs.values())


# Shapes of the exact family: N across the 16-row CTA (1, 15, 16, 17, 33 and the seed sweep),
# K from one block to 9 blocks (one more than the 8 warps that split K), M across the
# 4-row groups and the launches of MAX_M rows (8 since the kernel's 8-row build; 16 and 32
# before: all three seams are crossed). The simulator runs the "small" ones: one CTA of
# 256 threads takes ~1-3 s there (2-core CI machine), so mostly N <= 17 and M <= 17.
EXACT_N = (1, 7, 8, 9, 15, 16, 17, 33)
EXACT_M = (0, 1, 2, 3, 4, 5, 7, 8, 9, 16, 17, 32, 33)
EXACT_BLOCKS = (1, 3, 9)


def _exact_specs(add) -> None:
    """The cases of family ``q2_0_exact`` (kernel ``q2_0_gemv_exact``), through ``add``."""
    fam, ex = "q2_0_exact", EXACT_KERNELS
    for g in q2fmt.GROUPS:
        for blocks in EXACT_BLOCKS:
            for n in EXACT_N:
                small = n in (1, 15, 16, 17) and (blocks == 1 or (blocks == 9 and n == 16))
                small = small and (g == 128 or n in (1, 16))
                add(fam, n, blocks * g, 1, "uniform", "normal", ex if small else (), g)
        for m in EXACT_M:  # M sweep: 4-row groups and the row chunks
            sim = (0, 2, 3, 5, 16, 17) if g == 128 else (1, 9)
            add(fam, 7, 3 * g, m, "uniform", "normal", ex if m in sim else (), g)
        add(fam, 17, 9 * g, 33, "uniform", "normal", (), g)  # every seam at once
        for ak in EXACT_ACT_KINDS[1:]:  # special activations
            m = {"inf": 2, "nan": 2, "boundary": len(BOUNDARY_E), "outlier_huge": 3}.get(ak, 1)
            wk = "boundary" if ak == "boundary" else "uniform"
            n = 2 * len(BOUNDARY_SUBSETS) * len(BOUNDARY_D) if ak == "boundary" else 7
            small = ex if g == 128 or ak in ("boundary", "outlier_huge", "nan") else ()
            add(fam, n, 2 * g if ak == "boundary" else 3 * g, m, wk, ak, small, g)
        for wk in EXACT_WEIGHT_KINDS[1:]:  # special weights (boundary: with its activations)
            if wk != "boundary":
                add(fam, 9, 2 * g, 1, wk, "normal", ex if g == 128 or wk == "special_d" else (), g)
        add(fam, 9, 2 * g, 2, "special_d", "max", ex if g == 64 else (), g)
        add(fam, 9, 2 * g, 3, "code3", "outlier", ex if g == 128 else (), g)
        add(fam, 16, 2 * g, 17, "special_d", "outlier_huge", (), g)
        add(fam, 33, 2 * g, 5, "boundary", "boundary", (), g)


# Shapes of the NVFP4 exact family: K in blocks of 16 across the kernel's step of 64 elements
# (1 and 3 blocks: one padded step; 8: two whole steps; 9: a padded third step; 24 and 72: 6
# and 18 steps, more than the 8 warps that split K), N across the 16-row tile, M across the
# column tiles (1 for M <= 2, 2 for M <= 5, 3 for M <= 8) and the 8-row launches.
W4_EXACT_BLOCKS = (1, 3, 8, 9, 24, 72)
W4_EXACT_M = (0, 1, 2, 3, 4, 5, 7, 8, 9, 16, 17, 32, 33)


def _exact_nvfp4_specs(add) -> None:
    """The cases of family ``w4a16_exact`` (kernel ``w4a16_gemv_exact``), through ``add``."""
    fam, ex = "w4a16_exact", W4_EXACT_KERNELS
    b = NVFP4_BLOCK
    for blocks in W4_EXACT_BLOCKS:
        for n in EXACT_N:
            small = (n, blocks) in ((17, 1), (16, 8), (1, 9), (7, 24))
            add(fam, n, blocks * b, 1, "uniform", "normal", ex if small else ())
    for m in W4_EXACT_M:  # M sweep: the column tiles and the 8-row launches
        add(fam, 7, 8 * b, m, "uniform", "normal", ex if m in (0, 5, 17) else ())
    add(fam, 33, 9 * b, 33, "uniform", "normal", ())  # every seam at once
    for ak in EXACT_ACT_KINDS[1:]:  # special activations
        m = {"inf": 2, "nan": 2, "boundary": len(BOUNDARY_E), "outlier_huge": 3}.get(ak, 1)
        wk = "boundary" if ak == "boundary" else "uniform"
        n = 2 * len(BOUNDARY_SUBSETS) * len(W4_BOUNDARY_S) if ak == "boundary" else 7
        small = ex if ak in ("nan", "outlier_huge", "cancel") else ()
        add(fam, n, 2 * b if ak == "boundary" else 8 * b, m, wk, ak, small)
    for wk in W4_EXACT_WEIGHT_KINDS[1:]:  # special weights (boundary: with its activations)
        if wk != "boundary":
            small = ex if wk in ("special_s", "all_s", "gscale_nan", "gscale_neg") else ()
            add(fam, 9, 9 * b, 2 if wk == "all_s" else 1, wk, "normal", small)
    add(fam, 17, 8 * b, 3, "special_s", "outlier", ())
    add(fam, 16, 24 * b, 17, "all_s", "outlier_huge", ())


# fp16 activation kinds (activations_fp16): the specials of the bf16 kinds in fp16's range,
# "outlier" (elements 2**10 above the row: they leave low bits of the rest to the fixed
# point), "huge" (|a| in [2**14, 65504]: sums past 65504 overflow to +-Inf, both signs) and
# "subnormal" (fp16 subnormals only: results in the subnormals and rounding to +-0).
FP16_ACT_KINDS = ("normal", "zeros", "negzero", "inf", "nan", "subnormal", "max", "huge", "outlier")
FP16_MAX = 0x7BFF  # 65504
_FP16_SPECIALS = _Specials(0x7C00, 0xFC00, 0x7E01, 0x3FF, FP16_MAX, 10)


def _fp16_specs(add) -> None:
    """The cases of the fp16 families (``q2_0_exact_fp16``, ``w4a16_exact_fp16``): every fp16
    activation kind, both Q2_0 groups, special weights, an M sweep across the launches."""
    q2, w4 = "q2_0_exact_fp16", "w4a16_exact_fp16"
    ex, wx = FAMILY_KERNELS[q2], FAMILY_KERNELS[w4]
    b = NVFP4_BLOCK
    for g in q2fmt.GROUPS:
        add(q2, 17, 3 * g, 1, "uniform", "normal", ex, g)  # a tail CTA, a half step at g64
        for m in (0, 2, 5, 9, 17, 33):
            add(q2, 7, 3 * g, m, "uniform", "normal", ex if m == 2 else (), g)
        for ak in FP16_ACT_KINDS[1:]:
            m = 2 if ak in ("inf", "nan", "huge") else 1
            small = ex if g == 128 or ak in ("subnormal", "huge", "nan") else ()
            add(q2, 7, 2 * g, m, "uniform", ak, small, g)
        add(q2, 9, 2 * g, 2, "special_d", "huge", ex if g == 64 else (), g)
        add(q2, 9, 2 * g, 1, "special_d", "subnormal", ex if g == 128 else (), g)
        add(q2, 9, 2 * g, 3, "code3", "outlier", (), g)
    add(w4, 17, 4 * b, 1, "uniform", "normal", wx)
    for m in (0, 5, 9, 17, 33):
        add(w4, 7, 8 * b, m, "uniform", "normal", wx if m == 5 else ())
    for ak in FP16_ACT_KINDS[1:]:
        m = 2 if ak in ("inf", "nan", "huge") else 1
        add(w4, 7, 8 * b, m, "uniform", ak, wx if ak in ("subnormal", "huge", "nan") else ())
    for wk in ("special_s", "all_s", "gscale_neg", "gscale_nan", "gscale_huge"):
        add(
            w4,
            9,
            9 * b,
            2,
            wk,
            "huge" if wk != "all_s" else "normal",
            wx if wk == "special_s" else (),
        )
    add(w4, 9, 9 * b, 2, "special_s", "subnormal", ())


def activations_fp16(label: str, kind: str, m: int, k: int) -> np.ndarray:
    """fp16 bits uint16 [m, k] of ``kind`` (:data:`FP16_ACT_KINDS`); row r from label + f"/r{r}".

    normal: |a| in [2^-2, 2^4), random signs. zeros: +0. negzero: -0. inf: a normal row with
    +Inf at p and -Inf at q (rows with r odd: +Inf only). nan: one NaN (0x7E01 for even r,
    0xFFFF for odd r). subnormal: every element an fp16 subnormal. max: +65504 at k % 4 == 0
    of the first half, -65504 at k % 4 == 2 of the second. huge: |a| in [2^14, 65504].
    outlier: a normal row with up to 3 elements scaled by 2^10 (exponent field raised).
    """
    out = np.empty((m, k), np.uint16)
    for r in range(m):
        lab = f"{label}/r{r}"
        row = fp16_bits(lab + "/normal", k, 13, 18)
        shared = _shared_row(row, lab, r, kind, _FP16_SPECIALS) if kind in FP16_ACT_KINDS else None
        if shared is not None:
            row = shared
        elif kind == "huge":
            row = fp16_bits(lab + "/huge", k, 29, 30)
        else:
            raise ValueError(f"kind: expected one of {FP16_ACT_KINDS}, got {kind!r}")
        out[r] = row
    return out


def model_specs() -> list[GemvSpec]:
    """Real-model shapes (5120 x 5120, a 5120-wide dense layer): inputs regenerated, not stored.

    M = 9 activation rows: one more than the batched kernels' width of 8, so
    every kernel except batch16/batch32 runs a second, one-row launch. The
    exact family's cases take M = 17: one more than two launches of 8 (or one of 16).
    """
    n = k = 5120
    m = 9
    out = []
    for g in q2fmt.GROUPS:
        out.append(
            GemvSpec(
                f"model/q2_0/g{g}/{n}x{k}_m{m}",
                "q2_0",
                n,
                k,
                m,
                "ternary",
                "normal",
                g,
                Q2_KERNELS,
                (),
                "large",
            )  # fmt: skip
        )
    out.append(
        GemvSpec(
            f"model/w4a16/{n}x{k}_m{m}",
            "w4a16",
            n,
            k,
            m,
            "uniform",
            "normal",
            0,
            W4A16_KERNELS,
            (),
            "large",
        )  # fmt: skip
    )
    for g in q2fmt.GROUPS:
        out.append(
            GemvSpec(
                f"model/q2_0_exact/g{g}/{n}x{k}_m17",
                "q2_0_exact",
                n,
                k,
                17,
                "ternary",
                "normal",
                g,
                EXACT_KERNELS,
                (),
                "large",
            )  # fmt: skip
        )
    out.append(
        GemvSpec(
            f"model/w4a16_exact/{n}x{k}_m17",
            "w4a16_exact",
            n,
            k,
            17,
            "uniform",
            "outlier",
            0,
            W4_EXACT_KERNELS,
            (),
            "large",
        )  # fmt: skip
    )
    return out


def build_inputs(spec: GemvSpec) -> dict[str, np.ndarray]:
    """The input arrays of ``spec``: ``a`` (bf16 bits [m, k]; fp16 bits for the ``*_fp16``
    families) and the weight's arrays.

    Q2_0: ``w_raw`` (the block bytes). NVFP4: ``w_packed``, ``w_scales`` and
    ``w_g`` (uint32 [1], the fp32 bits of the global scale).
    """
    make = activations if act_format(spec.family) == BF16 else activations_fp16
    a = make(spec.act_label, spec.act_kind, spec.m, spec.k)
    return {"a": a, **FORMAT_CASES[weight_format(spec.family)].weight_arrays(spec)}


def _q2_weight_arrays(spec: GemvSpec) -> dict[str, np.ndarray]:
    return {"w_raw": q2_weight(spec.weight_label, spec.weight_kind, spec.n, spec.k, spec.group)}


def _nvfp4_weight_arrays(spec: GemvSpec) -> dict[str, np.ndarray]:
    packed, scales, g = w4_weight(spec.weight_label, spec.weight_kind, spec.n, spec.k)
    return {"w_packed": packed, "w_scales": scales, "w_g": np.array([g], np.uint32)}


def host_weight(spec: GemvSpec, arrays: dict[str, np.ndarray]):
    """The host weight (a ``Q2Weight`` or an ``Nvfp4Weight``) of ``spec``'s weight ``arrays``."""
    return FORMAT_CASES[weight_format(spec.family)].host_weight(spec, arrays)


def _q2_host_weight(spec: GemvSpec, x: dict[str, np.ndarray]) -> q2fmt.Q2Weight:
    return q2fmt.Q2Weight.from_bytes(x["w_raw"], spec.n, spec.k, spec.group)


def _nvfp4_host_weight(spec: GemvSpec, x: dict[str, np.ndarray]) -> Nvfp4Weight:
    g = float(x["w_g"].view(np.float32)[0])
    return Nvfp4Weight.from_parts(x["w_packed"], x["w_scales"], g)


def inputs_sha256(arrays: dict[str, np.ndarray]) -> str:
    """sha256 over the inputs: for each key in sorted order, key, dtype, shape, then the bytes."""
    h = hashlib.sha256()
    for key in sorted(arrays):
        x = np.ascontiguousarray(arrays[key])
        h.update(f"{key}|{x.dtype.str}|{x.shape}|".encode())
        h.update(x.tobytes())
    return h.hexdigest()


# -- pack -> bytes -> dequant round trips ---------------------------------------------------


@dataclass(frozen=True)
class RoundtripSpec:
    """A format round trip: codes + scales -> packed bytes -> codes, scales, dequantized values."""

    id: str
    family: str
    kind: str  # "random" or "adversarial"
    n: int
    k: int
    group: int = 0

    @property
    def label(self) -> str:
        return f"v{GENERATOR_VERSION}/{self.id}"


def roundtrip_specs() -> list[RoundtripSpec]:
    out = []
    for g in q2fmt.GROUPS:
        out.append(RoundtripSpec(f"roundtrip/q2_0/g{g}/random", "q2_0", "random", 5, 3 * g, g))
        out.append(
            RoundtripSpec(f"roundtrip/q2_0/g{g}/adversarial", "q2_0", "adversarial", 12, 2 * g, g)
        )
    out.append(RoundtripSpec("roundtrip/w4a16/random", "w4a16", "random", 5, 64))
    out.append(RoundtripSpec("roundtrip/w4a16/adversarial", "w4a16", "adversarial", 16, 256))
    return out


def roundtrip_inputs(spec: RoundtripSpec) -> dict[str, np.ndarray]:
    """Codes and scale bits of a round trip.

    Q2_0 (``codes`` uint8 [n, k], ``d`` fp16 bits [n, k/group]): random =
    uniform codes and signed scales; adversarial = code ``(j + j // 4 + r) % 4``
    at row r, position j (every code in every slot of a byte) and block i of
    the row-major blocks takes ``Q2_SPECIAL_D[i % 12]``.
    NVFP4 (``codes`` [n, k], ``scales`` [n, k/16], ``g`` uint32 [1] fp32 bits):
    random = uniform nibbles and uniform scale bytes (NaN bytes included),
    g = W4_DEFAULT_G; adversarial = code ``(j + j // 2 + r) % 16`` (every
    code in both nibble positions), scale of group i (row-major) = byte
    ``i % 256`` (all 256), g = 1.0.
    """
    return FORMAT_CASES[spec.family].roundtrip_inputs(spec)


def _q2_roundtrip_inputs(spec: RoundtripSpec) -> dict[str, np.ndarray]:
    n, k = spec.n, spec.k
    nb = k // spec.group
    if spec.kind == "random":
        codes = fields(spec.label + "/codes", n * k, 2).astype(np.uint8).reshape(n, k)
        d = fp16_bits(spec.label + "/d", n * nb).reshape(n, nb)
    else:
        r, j = np.indices((n, k))
        codes = ((j + j // 4 + r) % 4).astype(np.uint8)
        d = np.array(Q2_SPECIAL_D, np.uint16)[np.arange(n * nb) % len(Q2_SPECIAL_D)]
        d = d.reshape(n, nb)
    return {"codes": codes, "d": d}


def _nvfp4_roundtrip_inputs(spec: RoundtripSpec) -> dict[str, np.ndarray]:
    n, k = spec.n, spec.k
    ng = k // NVFP4_BLOCK
    if spec.kind == "random":
        codes = fields(spec.label + "/codes", n * k, 4).astype(np.uint8).reshape(n, k)
        scales = fields(spec.label + "/s", n * ng, 8).astype(np.uint8).reshape(n, ng)
        g = W4_DEFAULT_G
    else:
        r, j = np.indices((n, k))
        codes = ((j + j // 2 + r) % 16).astype(np.uint8)
        scales = (np.arange(n * ng) % 256).astype(np.uint8).reshape(n, ng)
        g = 0x3F800000
    return {"codes": codes, "scales": scales, "g": np.array([g], np.uint32)}


@dataclass(frozen=True)
class FormatCases:
    """How the cases of one weight format are built (:data:`FORMAT_CASES`)."""

    weight_arrays: Callable[[GemvSpec], dict[str, np.ndarray]]  # a GEMV case's ``w_*`` arrays
    host_weight: Callable[[GemvSpec, dict[str, np.ndarray]], object]  # their host weight
    roundtrip_inputs: Callable[[RoundtripSpec], dict[str, np.ndarray]]  # a round trip's inputs


# Weight format (a registry family name, :func:`weight_format`) -> how its cases are built:
# the suite looks the format of a case up here and never compares family names.
FORMAT_CASES: dict[str, FormatCases] = {
    "q2_0": FormatCases(_q2_weight_arrays, _q2_host_weight, _q2_roundtrip_inputs),
    "w4a16": FormatCases(_nvfp4_weight_arrays, _nvfp4_host_weight, _nvfp4_roundtrip_inputs),
}
