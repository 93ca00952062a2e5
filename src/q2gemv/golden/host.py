"""Host (NumPy) checks of the format code: hand tables, ggml's vectors, pack/dequant round trips.

Each table is checked against two implementations where one exists: the
package's format module (``q2gemv.formats.*``) and ``ml_dtypes``
(``float4_e2m1fn``, ``float8_e4m3fn``, ``bfloat16``). A disagreement names
the table entry. NaN expectations written ``"nan"`` (and the dequantized
values of round trips) are compared as "is a NaN": the payload NumPy
produces for ``0 * Inf`` is the host CPU's, not a format fact.
"""

from __future__ import annotations

import time

import ml_dtypes
import numpy as np

from ..formats import bf16 as bf16fmt
from ..formats import nvfp4 as nvfmt
from ..formats import q2_0 as q2fmt
from .report import CheckResult, result_from_bits
from .suite import HostCase

F32_QNAN = 0x7FC00000
BACKEND = "reference"


def _hex(s: str) -> int:
    return int(s, 16)


def _f32_bits_of(values) -> np.ndarray:
    """Decimal strings ('-0', '0.5', 'nan') -> fp32 bits; NaN -> 0x7FC00000."""
    out = np.array([float(v) for v in values], np.float32).view(np.uint32).copy()
    out[np.isnan(out.view(np.float32))] = F32_QNAN
    return out


def canon_nan_f32(bits) -> np.ndarray:
    """fp32 bits with every NaN replaced by 0x7FC00000."""
    b = np.asarray(bits).astype(np.uint32)
    return np.where(np.isnan(b.view(np.float32)), np.uint32(F32_QNAN), b)


class _Checks:
    """Collects one CheckResult per host function checked for a case."""

    def __init__(self, case_id: str):
        self.case_id = case_id
        self.results: list[CheckResult] = []
        self.t0 = time.perf_counter()

    def bits(self, fn: str, got, want) -> None:
        t = time.perf_counter()
        self.results.append(
            result_from_bits(self.case_id, f"host:{fn}", BACKEND, got, want, t - self.t0)
        )
        self.t0 = t

    def run(self, fn: str, body) -> None:
        """Run ``body() -> (got, want)``; an exception becomes an error result."""
        try:
            got, want = body()
        except Exception as e:  # noqa: BLE001 - a broken format function is a finding
            self.results.append(
                CheckResult(self.case_id, f"host:{fn}", BACKEND, "error", message=repr(e))
            )
            return
        self.bits(fn, got, want)


# -- tables ---------------------------------------------------------------------------------


def check_q2_0_table(case_id: str, t: dict) -> list[CheckResult]:
    c = _Checks(case_id)
    bytes_ = np.array([_hex(e["byte"]) for e in t["slots"]], np.uint8)
    codes = np.array([e["codes"] for e in t["slots"]], np.uint8)  # [entries, 4]

    def unpack():  # one group-64 block per entry, every qs byte the entry's byte
        raw = np.concatenate(
            [np.r_[np.uint8(0), np.uint8(0x3C), np.full(16, b, np.uint8)] for b in bytes_]
        )
        return q2fmt.unpack_codes(raw, len(bytes_), 64, 64), np.tile(codes, (1, 16))

    def pack():
        cds = np.tile(codes, (1, 16))
        raw = q2fmt.pack(cds, np.ones((len(bytes_), 1), np.float16), 64).reshape(len(bytes_), 18)
        return raw[:, 2:].copy(), np.repeat(bytes_[:, None], 16, axis=1)

    c.run("q2_0.unpack_codes", unpack)
    c.run("q2_0.pack", pack)
    vals = np.array([t["code_values"][str(i)] for i in range(4)], np.float32)
    c.bits("table.code_values", vals.view(np.uint32), np.float32([-1, 0, 1, 2]).view(np.uint32))

    for g in q2fmt.GROUPS:

        def dequant(g=g):
            got, want = [], []
            for e in t["scales"]:
                d = np.array([_hex(e["d"])], np.uint16)
                raw = np.concatenate([d.view(np.uint8), np.full(g // 4, 0xE4, np.uint8)])
                w = q2fmt.Q2Weight.from_bytes(raw, 1, g, g).dequantize()[0]
                got.append(canon_nan_f32(w.view(np.uint32)))  # codes 0,1,2,3 repeating
                want.append(np.tile(_want_bits(e["values"]), g // 4))
            return np.array(got), np.array(want)

        c.run(f"q2_0.dequantize[g{g} special scales]", dequant)
    for b in t["blocks"]:
        g = b["group"]
        raw = np.frombuffer(bytes.fromhex(b["hex"]), np.uint8)

        def block_dequant(raw=raw, g=g, first8=b["first8"]):
            w = q2fmt.Q2Weight.from_bytes(raw, 1, g, g)
            return canon_nan_f32(w.dequantize()[0, :8].view(np.uint32)), _want_bits(first8)

        def block_pack(raw=raw, g=g):
            w = q2fmt.Q2Weight.from_bytes(raw, 1, g, g)
            return q2fmt.Q2Weight.from_codes(w.codes(), w.scales(), g).raw, raw

        c.run(f"q2_0.dequantize[g{g} block bytes]", block_dequant)
        c.run(f"q2_0.from_codes[g{g} block bytes]", block_pack)
    return c.results


def _want_bits(values: list[str]) -> np.ndarray:
    return np.array([F32_QNAN if v == "nan" else _hex(v) for v in values], np.uint32)


def check_e2m1_table(case_id: str, t: dict) -> list[CheckResult]:
    c = _Checks(case_id)
    codes = np.arange(16, dtype=np.uint8)
    want = _f32_bits_of([t["values"][f"0x{i:X}"] for i in range(16)])
    c.run("nvfp4.e2m1_decode", lambda: (nvfmt.e2m1_decode(codes).view(np.uint32), want))
    c.run(
        "ml_dtypes.float4_e2m1fn",
        lambda: (codes.view(ml_dtypes.float4_e2m1fn).astype(np.float32).view(np.uint32), want),
    )
    bytes_ = np.array([_hex(e["byte"]) for e in t["bytes"]], np.uint8)
    pair = _f32_bits_of([v for e in t["bytes"] for v in (e["even"], e["odd"])]).reshape(-1, 2)
    c.run(
        "nvfp4.unpack_nibbles",
        lambda: (nvfmt.e2m1_decode(nvfmt.unpack_nibbles(bytes_[:, None])).view(np.uint32), pair),
    )
    # encode the values back (E2M1 encodes -0.0 as code 0: the sign follows x < 0; so compare
    # the packed bytes only where neither nibble is -0)
    vals = pair.view(np.float32)
    keep = ~np.any((vals == 0) & np.signbit(vals), axis=1)
    c.run(
        "nvfp4.pack_nibbles(e2m1_encode)",
        lambda: (nvfmt.pack_nibbles(nvfmt.e2m1_encode(vals[keep]))[:, 0], bytes_[keep]),
    )
    return c.results


def check_e4m3_table(case_id: str, t: dict) -> list[CheckResult]:
    c = _Checks(case_id)
    b = np.arange(256, dtype=np.uint8)
    want = _f32_bits_of([t["values"][f"0x{i:02X}"] for i in range(256)])
    c.run("nvfp4.e4m3_decode", lambda: (canon_nan_f32(nvfmt.e4m3_decode(b).view(np.uint32)), want))
    c.run(
        "ml_dtypes.float8_e4m3fn",
        lambda: (
            canon_nan_f32(b.view(ml_dtypes.float8_e4m3fn).astype(np.float32).view(np.uint32)),
            want,
        ),
    )
    finite = (b & 0x7F) != 0x7F
    c.run(
        "nvfp4.e4m3_encode",
        lambda: (nvfmt.e4m3_encode(want.view(np.float32)[finite]), b[finite]),
    )
    return c.results


def check_bf16_table(case_id: str, t: dict) -> list[CheckResult]:
    c = _Checks(case_id)
    f32 = np.array([_hex(e["f32"]) for e in t["round"]], np.uint32)
    want = np.array([_hex(e["bf16"]) for e in t["round"]], np.uint16)
    c.run("bf16.f32_to_bf16_bits", lambda: (bf16fmt.f32_to_bf16_bits(f32.view(np.float32)), want))

    def ml():
        with np.errstate(invalid="ignore"):
            got = f32.view(np.float32).astype(ml_dtypes.bfloat16).view(np.uint16)
        nan = np.isnan(got.view(ml_dtypes.bfloat16).astype(np.float32))
        return np.where(nan, np.uint16(bf16fmt.BF16_NAN), got), want

    c.run("ml_dtypes.bfloat16(round)", ml)
    h = np.array([_hex(e["bf16"]) for e in t["widen"]], np.uint16)
    wide = np.array([_hex(e["f32"]) for e in t["widen"]], np.uint32)
    c.run("bf16.bf16_bits_to_f32", lambda: (bf16fmt.bf16_bits_to_f32(h).view(np.uint32), wide))
    c.run(
        "ml_dtypes.bfloat16(widen)",
        lambda: (h.view(ml_dtypes.bfloat16).astype(np.float32).view(np.uint32), wide),
    )
    return c.results


TABLE_CHECKS = {
    "tables/q2_0": check_q2_0_table,
    "tables/e2m1": check_e2m1_table,
    "tables/e4m3": check_e4m3_table,
    "tables/bf16": check_bf16_table,
}


# -- ggml's external vectors --------------------------------------------------------------------


def check_ggml(case_id: str, z: dict) -> list[CheckResult]:
    """ggml's quantize_row_q2_0_ref / dequantize_row_q2_0 outputs, reproduced byte for byte."""
    c = _Checks(case_id)
    for g in q2fmt.GROUPS:
        for i in range(3):
            x, raw = z[f"g{g}_case{i}_x"], z[f"g{g}_case{i}_raw"]
            deq = z[f"g{g}_case{i}_dequant"]
            c.case_id = f"ggml/g{g}/case{i}"
            c.run(
                "q2_0.quantize_q2_0(ggml)",
                lambda x=x, g=g, raw=raw: (
                    q2fmt.quantize_q2_0(x, group=g, allow_nonfinite=True).raw,
                    raw,
                ),
            )
            c.run(
                "q2_0.dequantize",
                lambda x=x, g=g, raw=raw, deq=deq: (
                    canon_nan_f32(
                        q2fmt.Q2Weight.from_bytes(raw, *x.shape, group=g)
                        .dequantize()
                        .view(np.uint32)
                    ),
                    canon_nan_f32(deq.view(np.uint32)),
                ),
            )
    return c.results


# -- round trips ------------------------------------------------------------------------------------


def check_roundtrip(case_id: str, payload) -> list[CheckResult]:
    meta, arrays = payload
    c = _Checks(case_id)
    spec = meta["spec"]
    x = {k: arrays["in/" + v] for k, v in meta["inputs"].items()}
    want = {k: arrays["want/" + v] for k, v in meta["want"].items()}
    _ROUNDTRIP_CHECKS[spec["family"]](c, spec, x, want)
    return c.results


def _check_q2_roundtrip(c: _Checks, spec: dict, x: dict, want: dict) -> None:
    n, k, g = spec["n"], spec["k"], spec["group"]
    c.run(
        "q2_0.from_codes",
        lambda: (
            q2fmt.Q2Weight.from_codes(x["codes"], x["d"].view(np.float16), g).raw,
            want["raw"],
        ),
    )
    w = lambda: q2fmt.Q2Weight.from_bytes(want["raw"], n, k, g)  # noqa: E731
    c.run("q2_0.codes", lambda: (w().codes(), x["codes"]))
    c.run("q2_0.scales", lambda: (w().scales().view(np.uint16), x["d"]))
    c.run(
        "q2_0.dequantize",
        lambda: (canon_nan_f32(w().dequantize().view(np.uint32)), want["dequant"]),
    )


def _check_nvfp4_roundtrip(c: _Checks, spec: dict, x: dict, want: dict) -> None:
    gs = float(x["g"].view(np.float32)[0])
    c.run(
        "nvfp4.from_codes",
        lambda: (
            nvfmt.Nvfp4Weight.from_codes(x["codes"], x["scales"], gs).packed,
            want["packed"],
        ),
    )
    w = lambda: nvfmt.Nvfp4Weight.from_parts(want["packed"], x["scales"], gs)  # noqa: E731
    c.run("nvfp4.codes", lambda: (w().codes(), x["codes"]))
    c.run(
        "nvfp4.dequantize",
        lambda: (canon_nan_f32(w().dequantize().view(np.uint32)), want["dequant"]),
    )


def roundtrip_expect(spec, x: dict) -> dict[str, np.ndarray]:
    """Expected outputs of a round trip, computed by the format modules (used by regen)."""
    return _ROUNDTRIP_EXPECT[spec.family](spec, x)


def _q2_roundtrip_expect(spec, x: dict) -> dict[str, np.ndarray]:
    w = q2fmt.Q2Weight.from_codes(x["codes"], x["d"].view(np.float16), spec.group)
    return {"raw": w.raw.copy(), "dequant": canon_nan_f32(w.dequantize().view(np.uint32))}


def _nvfp4_roundtrip_expect(spec, x: dict) -> dict[str, np.ndarray]:
    gs = float(x["g"].view(np.float32)[0])
    w = nvfmt.Nvfp4Weight.from_codes(x["codes"], x["scales"], gs)
    return {"packed": w.packed.copy(), "dequant": canon_nan_f32(w.dequantize().view(np.uint32))}


# A round trip's family (its weight format) -> its checks and its expected outputs.
_ROUNDTRIP_CHECKS = {"q2_0": _check_q2_roundtrip, "w4a16": _check_nvfp4_roundtrip}
_ROUNDTRIP_EXPECT = {"q2_0": _q2_roundtrip_expect, "w4a16": _nvfp4_roundtrip_expect}


def run_host_case(case: HostCase) -> list[CheckResult]:
    """Every host check of one format case (errors become error results, never exceptions)."""
    try:
        if case.id in TABLE_CHECKS:
            return TABLE_CHECKS[case.id](case.id, case.payload)
        if case.set == "ggml":
            return check_ggml(case.id, case.payload)
        if case.set == "roundtrip":
            return check_roundtrip(case.id, case.payload)
        raise ValueError(f"no host check for {case.id}")
    except Exception as e:  # noqa: BLE001 - a malformed table is a failure, not a crash
        return [
            CheckResult(case.id, "host:table", BACKEND, "error", message=f"{type(e).__name__}: {e}")
        ]
