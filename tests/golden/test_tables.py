"""The hand-written format tables: literal, independent of the code they check, and checked.

Each table is held against the package's format modules AND ml_dtypes, and
the entries are re-derived here from the bit diagrams with plain integer
arithmetic, so a wrong literal cannot pass by agreeing with a wrong module.
"""

from __future__ import annotations

import copy
import json
import math
import struct

import ml_dtypes
import numpy as np
import pytest

from q2gemv.formats import bf16 as bf16fmt
from q2gemv.formats import nvfp4 as nvfmt
from q2gemv.formats import q2_0 as q2fmt
from q2gemv.golden import host, store, suite

DATA = store.default_data_dir()


def _table(name: str) -> dict:
    return json.loads((DATA / suite.TABLE_FILES[name]).read_text())


def _f32_bits(x: float) -> int:
    return struct.unpack("<I", struct.pack("<f", x))[0]


@pytest.mark.parametrize("name", sorted(suite.TABLE_FILES))
def test_every_table_passes_its_host_checks(name):
    case = suite.HostCase("tables/" + name, suite.TABLE_FILES[name], _table(name))
    results = host.run_host_case(case)
    assert results, name
    bad = [r.details() for r in results if not r.ok]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("name", sorted(suite.TABLE_FILES))
def test_every_table_carries_its_bit_diagram(name):
    t = _table(name)
    assert t["diagram"] and all(isinstance(line, str) for line in t["diagram"])


def test_q2_0_slots_cover_every_code_in_every_slot():
    t = _table("q2_0")
    seen = set()
    for e in t["slots"]:
        b = int(e["byte"], 16)
        # independent of the format module: the LSB-first rule of the diagram
        assert e["codes"] == [(b >> (2 * s)) & 3 for s in range(4)], e
        seen.update((s, c) for s, c in enumerate(e["codes"]))
    assert seen == {(s, c) for s in range(4) for c in range(4)}


def test_q2_0_scale_values_are_code_minus_one_times_d():
    t = _table("q2_0")
    want_d = {0x0000, 0x8000, 0x0001, 0x03FF, 0x0400, 0x7BFF, 0x7C00, 0xFC00, 0x7E00}
    assert want_d <= {int(e["d"], 16) for e in t["scales"]}
    for e in t["scales"]:
        d = float(np.array([int(e["d"], 16)], np.uint16).view(np.float16)[0])
        for code, v in enumerate(e["values"]):
            c = float(code - 1)
            prod = math.nan if (c == 0 and math.isinf(d)) else c * d
            if math.isnan(prod):
                assert v == "nan", e
            else:
                assert int(v, 16) == _f32_bits(prod), (e, code)


def test_q2_0_blocks_both_groups_little_endian_d_first():
    t = _table("q2_0")
    assert {b["group"] for b in t["blocks"]} == set(q2fmt.GROUPS)
    for b in t["blocks"]:
        raw = bytes.fromhex(b["hex"])
        assert len(raw) == q2fmt.block_bytes(b["group"])
        d = struct.unpack("<e", raw[:2])[0]
        codes = [(raw[2 + j // 4] >> (2 * (j % 4))) & 3 for j in range(8)]
        assert [int(v, 16) for v in b["first8"]] == [_f32_bits((c - 1) * d) for c in codes]


def test_e2m1_table_against_ml_dtypes_and_the_bit_fields():
    t = _table("e2m1")
    for code in range(16):
        v = float(t["values"][f"0x{code:X}"])
        ml = float(np.array([code], np.uint8).view(ml_dtypes.float4_e2m1fn)[0])
        e, m, s = (code >> 1) & 3, code & 1, code >> 3
        mag = m * 0.5 if e == 0 else (1 + m / 2) * 2.0 ** (e - 1)
        assert _f32_bits(v) == _f32_bits(ml) == _f32_bits(-mag if s else mag), code
    lows = {int(e["byte"], 16) & 0xF for e in t["bytes"]}
    highs = {int(e["byte"], 16) >> 4 for e in t["bytes"]}
    assert lows == highs == set(range(16))
    for e in t["bytes"]:
        b = int(e["byte"], 16)
        assert _f32_bits(float(e["even"])) == _f32_bits(float(t["values"][f"0x{b & 0xF:X}"]))
        assert _f32_bits(float(e["odd"])) == _f32_bits(float(t["values"][f"0x{b >> 4:X}"]))


def test_e4m3_table_against_ml_dtypes_and_the_format_module():
    t = _table("e4m3")
    assert len(t["values"]) == 256
    b = np.arange(256, dtype=np.uint8)
    ml = b.view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    mod = nvfmt.e4m3_decode(b)
    for i in range(256):
        v = t["values"][f"0x{i:02X}"]
        if (i & 0x7F) == 0x7F:
            assert v == "nan" and np.isnan(ml[i]) and np.isnan(mod[i]), i
        else:
            assert _f32_bits(float(v)) == _f32_bits(float(ml[i])) == _f32_bits(float(mod[i])), i
    assert float(t["values"]["0x01"]) == 2.0**-9 and float(t["values"]["0x7E"]) == 448.0


def test_bf16_table_against_ml_dtypes_and_the_format_module():
    t = _table("bf16")
    for e in t["round"]:
        f = np.array([int(e["f32"], 16)], np.uint32).view(np.float32)
        want = int(e["bf16"], 16)
        assert int(bf16fmt.f32_to_bf16_bits(f)[0]) == want, e
        with np.errstate(invalid="ignore"):
            ml = f.astype(ml_dtypes.bfloat16)
        if e.get("nan"):
            assert want == bf16fmt.BF16_NAN and np.isnan(ml.astype(np.float32)[0]), e
        else:
            assert int(ml.view(np.uint16)[0]) == want, e
    whys = " ".join(e["why"] for e in t["round"])
    for needed in ("tie", "-0", "Inf", "NaN", "subnormal"):
        assert needed in whys, needed
    for e in t["widen"]:
        h = np.array([int(e["bf16"], 16)], np.uint16)
        want = int(e["f32"], 16)
        assert int(bf16fmt.bf16_bits_to_f32(h).view(np.uint32)[0]) == want
        assert int(h.view(ml_dtypes.bfloat16).astype(np.float32).view(np.uint32)[0]) == want


def test_a_wrong_table_entry_is_reported_not_passed():
    t = copy.deepcopy(_table("e4m3"))
    t["values"]["0x38"] = "1.125"  # 1.0 is right
    results = host.run_host_case(suite.HostCase("tables/e4m3", "tables/e4m3.json", t))
    bad = [r for r in results if not r.ok]
    assert {r.kernel for r in bad} >= {"host:nvfp4.e4m3_decode", "host:ml_dtypes.float8_e4m3fn"}
    dec = next(r for r in bad if r.kernel == "host:nvfp4.e4m3_decode")
    assert dec.mismatches == 1
    assert dec.first[0][:2] == (0, 0x38)  # (row, col) = the byte
    assert "got 0x3F800000 want 0x3F900000" in dec.details()
