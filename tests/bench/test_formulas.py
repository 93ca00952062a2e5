"""The CPU-checkable parts of ``q2gemv bench``: byte formulas, floors, rotation, the case
matrix, argument parsing, derived columns, CSV, markdown, the plot, and the layering of
the ``q2gemv.bench`` subpackage.

Nothing here times anything (benchmarks are scripts, docs/measurements.md).
"""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

import numpy as np
import pytest

from q2gemv import bench as B
from q2gemv.dispatch.nvfp4_tiers import W4a16BatchmTiers
from q2gemv.formats.nvfp4 import Nvfp4Weight
from q2gemv.formats.q2_0 import Q2Weight

ROOT = Path(__file__).resolve().parents[2]
Q2_KERNELS = {"q2_0_gemv": 1, "q2_0_gemv_vec": 1, "q2_0_gemv_vec_batchm": 8}
ALL_W4 = W4a16BatchmTiers.resolve(B.W4A16_MAX_M)  # every tier present, rt2 at width 8


# -- byte formulas and floors (literal numbers, worked by hand) ------------------------


def test_q2_bytes_literal():
    # 5120 rows x 40 blocks x 34 B (g128) + act 5120*2 + out 5120*2
    assert B.bytes_moved("q2_0", 5120, 5120, 1, 128) == 6_963_200 + 10_240 + 10_240
    # g64: 80 blocks x 18 B a row
    assert B.bytes_moved("q2_0", 5120, 5120, 1, 64) == 7_372_800 + 20_480
    # M = 8: activations 8*5120*2, output 8*17408*2
    assert B.bytes_moved("q2_0", 17408, 5120, 8, 128) == 17408 * 40 * 34 + 81_920 + 278_528


def test_nvfp4_bytes_literal():
    # codes N*K/2 + E4M3 scales N*K/16 + 4 (fp32 global) + act + out
    assert B.bytes_moved("w4a16", 5120, 5120, 4, 16) == 13_107_200 + 1_638_400 + 4 + 40_960 * 2


def test_bf16_bytes_literal():
    assert B.bytes_moved("bf16", 16384, 16384, 32, 0) == 536_870_912 + 1_048_576 * 2


def test_weight_bytes_agree_with_the_format_objects():
    rng = np.random.default_rng(0)
    for g in (64, 128):
        n, k = 3, 2 * g
        raw = rng.integers(0, 256, n * (k // g) * (2 + g // 4), dtype=np.uint8)
        assert B.weight_bytes("q2_0", n, k, g) == Q2Weight.from_bytes(raw, n, k, g).nbytes
    n, k = 5, 64
    w = Nvfp4Weight(
        rng.integers(0, 256, (n, k // 2), dtype=np.uint8),
        rng.integers(0x20, 0x60, (n, k // 16), dtype=np.uint8),
        1.0,
    )
    assert B.weight_bytes("w4a16", n, k) == w.nbytes


def test_weight_bytes_unknown_family():
    with pytest.raises(ValueError, match="family"):
        B.weight_bytes("fp8", 1, 16)


def test_fma_floor_literal():
    # 5120*5120 / (132 SMs * 128 lanes * 1.98 GHz) = 0.7836 us
    assert B.fma_floor_s(5120, 5120, 1, 132, 1.98e9) * 1e6 == pytest.approx(0.78363, rel=1e-4)
    assert B.fma_floor_s(5120, 5120, 8, 132, 1.98e9) == pytest.approx(
        8 * B.fma_floor_s(5120, 5120, 1, 132, 1.98e9)
    )


# -- rotation ---------------------------------------------------------------------------


@pytest.mark.parametrize("per_copy", [1, 7_000_000, 14_745_604, 52_428_800, 60 * 2**20, 10**9])
def test_rotation_exceeds_twice_l2_minimally(per_copy):
    l2 = 60 * 2**20
    c = B.rotation_copies(per_copy, l2)
    assert c >= 2
    assert c * per_copy > 2 * l2
    if c > 2:
        assert (c - 1) * per_copy <= 2 * l2


def test_rotation_refuses_empty_copies():
    with pytest.raises(ValueError):
        B.rotation_copies(0, 1)


@pytest.mark.parametrize("copies, min_calls", [(2, 32), (17, 32), (3, 32), (40, 32), (1, 1)])
def test_calls_per_graph_is_a_multiple_of_copies(copies, min_calls):
    n = B.calls_per_graph(copies, min_calls)
    assert n % copies == 0 and n >= min_calls and n - copies < max(min_calls, copies)


# -- the case matrix ------------------------------------------------------------------------


def _cases(**kw):
    kw.setdefault("tiers", ALL_W4)
    kw.setdefault("exact_m", True)
    kw.setdefault("q2_kernels", Q2_KERNELS)
    return B.build_cases(**kw)


def _index(cases):
    return {(c.family, c.kernel, c.n, c.k, c.m): c for c in cases}


def test_default_matrix_covers_the_issue():
    cases = _cases()
    idx = _index(cases)
    for n, k in B.SHAPES:
        for m in B.MS:
            assert ("bf16", B.TORCH_KERNEL, n, k, m) in idx
            assert ("q2_0", "q2_0_gemv_vec_batchm", n, k, m) in idx
            assert any(
                c.family == "w4a16" and c.selected for c in cases if (c.n, c.k, c.m) == (n, k, m)
            )
        for name in ("q2_0_gemv", "q2_0_gemv_vec"):
            assert ("q2_0", name, n, k, 1) in idx
            assert ("q2_0", name, n, k, 2) not in idx  # M=1 kernels only at M=1
    assert B.SHAPES == ((5120, 5120), (17408, 5120), (5120, 17408), (16384, 16384))
    assert B.MS == (1, 2, 3, 4, 5, 6, 7, 8, 16, 32)


def test_seed_w4a16_table_is_in_the_matrix():
    idx = _index(_cases())
    for n, k in B.W4A16_SWEEP_SHAPES:
        for name, ms in (
            ("w4a16_gemv_batch4", range(1, 5)),
            ("w4a16_gemv_batch5", range(1, 6)),
            ("w4a16_gemv_batch6", range(1, 7)),
            ("w4a16_gemv_batch7", range(1, 8)),
            ("w4a16_gemv_batch8", range(1, 9)),
            ("w4a16_gemv_batch8_rt2", range(1, 9)),
        ):
            for m in ms:
                c = idx[("w4a16", name, n, k, m)]
                assert "tier" in c.role and c.launches == ((0, m, name),)
            assert ("w4a16", name, n, k, max(ms) + 1) not in idx  # never beyond its width
    # the sweep is only on the seed's shapes
    assert ("w4a16", "w4a16_gemv_batch8", 5120, 17408, 5) not in idx


def test_dispatch_picks_the_narrowest_tier():
    cases = _cases(shapes=((5120, 17408),))
    picked = {c.m: c.kernel for c in cases if c.family == "w4a16" and c.selected}
    assert picked == {
        1: "w4a16_gemv_batch4",
        2: "w4a16_gemv_batch4",
        3: "w4a16_gemv_batch4",
        4: "w4a16_gemv_batch4",
        5: "w4a16_gemv_batch5",
        6: "w4a16_gemv_batch6",
        7: "w4a16_gemv_batch7",
        8: "w4a16_gemv_batch8_rt2",
        16: "w4a16_gemv_batch16",
        32: "w4a16_gemv_batch32",
    }
    no_exact = _cases(shapes=((5120, 17408),), exact_m=False)
    picked = {c.m: c.kernel for c in no_exact if c.family == "w4a16" and c.selected}
    assert picked[5] == picked[7] == "w4a16_gemv_batch8_rt2"


def test_dispatch_rows_merge_into_the_sweep_rows():
    cases = _cases(shapes=((5120, 5120),))
    keys = [c.key for c in cases]
    assert len(keys) == len(set(keys))
    c = _index(cases)[("w4a16", "w4a16_gemv_batch5", 5120, 5120, 5)]
    assert c.selected and c.role == "tier+dispatch"
    assert not _index(cases)[("w4a16", "w4a16_gemv_batch8", 5120, 5120, 5)].selected


def test_launch_chunks_cover_every_row_within_the_kernel_limit():
    limit = {**Q2_KERNELS, **B.W4A16_MAX_M, **B.exact_kernel_table(), B.TORCH_KERNEL: 10**9}
    for c in _cases(ms=(1, 5, 8, 9, 16, 17, 32, 33, 70)):
        r = 0
        for r0, rows, name in c.launches:
            assert r0 == r and 1 <= rows <= limit[name]
            r += rows
        assert r == c.m, c
    idx = _index(_cases(ms=(16, 33)))
    assert len(idx[("q2_0", "q2_0_gemv_vec_batchm", 5120, 5120, 16)].launches) == 2
    w33 = next(c for c in idx.values() if c.family == "w4a16" and c.m == 33 and c.n == 5120)
    assert w33.kernel == "w4a16_gemv_batch32+w4a16_gemv_batch4"


def test_order_is_shape_by_shape_with_bf16_first():
    cases = _cases(shapes=((5120, 5120), (16384, 16384)), ms=(1, 4, 16))
    shapes = [(c.n, c.k) for c in cases]
    assert shapes == sorted(shapes, key=[(5120, 5120), (16384, 16384)].index)
    first = [c.family for c in cases if (c.n, c.k) == (16384, 16384)]
    assert first[0] == "bf16"
    w4 = [c.kernel for c in cases if c.family == "w4a16" and c.n == 5120]
    assert w4.index("w4a16_gemv_batch4") < w4.index("w4a16_gemv_batch16")  # natural order


def test_kernel_filter_keeps_bf16_for_the_kept_cases():
    cases = _cases(kernels=("q2_0_gemv_vec",), ms=(1, 2))
    fams = {(c.family, c.kernel) for c in cases}
    assert fams == {("q2_0", "q2_0_gemv_vec"), ("bf16", B.TORCH_KERNEL)}
    assert {(c.n, c.k, c.m) for c in cases if c.family == "bf16"} == {
        (n, k, 1) for n, k in B.SHAPES
    }
    only_bf16 = _cases(kernels=("bf16",), ms=(1,))
    assert {c.family for c in only_bf16} == {"bf16"} and len(only_bf16) == len(B.SHAPES)
    assert not [c for c in _cases(torch=False) if c.family == "bf16"]


def test_groups_and_shape_validation():
    cases = _cases(groups=(64, 128), shapes=((5120, 5120),), ms=(1,))
    assert {c.group for c in cases if c.family == "q2_0"} == {64, 128}
    with pytest.raises(ValueError, match="group"):
        _cases(shapes=((8, 96),))
    with pytest.raises(ValueError):
        _cases(ms=(0, 1))


def test_default_q2_table_has_the_seed_kernels():
    table = B.q2_kernel_table()
    assert {k: table[k] for k in Q2_KERNELS} == Q2_KERNELS


# -- argument parsing ---------------------------------------------------------------------------


def test_parse_shapes_and_ints():
    assert B.parse_shapes("5120x5120, 17408X5120") == ((5120, 5120), (17408, 5120))
    assert B.parse_ints("1-8,16,32") == B.MS
    assert B.parse_ints("4,2,2") == (2, 4)
    for bad in ("5120", "ax3", "0x5"):
        with pytest.raises(ValueError):
            B.parse_shapes(bad)
    for bad in ("0", "x", ""):
        with pytest.raises(ValueError):
            B.parse_ints(bad)


def _settings(argv):
    p = argparse.ArgumentParser()
    B.add_arguments(p)
    return B.Settings.from_args(p.parse_args(argv))


def test_settings_defaults_quick_and_refusals():
    st = _settings([])
    assert st.shapes == B.SHAPES and st.ms == B.MS and st.repeats >= 5 and st.groups == (128,)
    # never the committed benchmarks/results by default; the prefix comes from the device
    assert st.out == Path(B.DEFAULT_OUT) and st.prefix is None and st.timing == "graph"
    q = _settings(["--quick"])
    assert q.shapes == B.QUICK_SHAPES and q.ms == B.QUICK_MS
    q = _settings(["--quick", "--m", "2"])
    assert q.shapes == B.QUICK_SHAPES and q.ms == (2,)
    with pytest.raises(ValueError, match="repeats"):
        _settings(["--repeats", "3"])
    assert _settings(["--repeats", "1", "--dry-run"]).repeats == 1
    with pytest.raises(ValueError, match="unknown"):
        _settings(["--kernels", "q2_0_gemv_fast"])
    st = _settings(["--kernels", "w4a16,q2_0_gemv", "--group", "64,128", "--l2-mib", "1"])
    assert st.kernels == ("w4a16", "q2_0_gemv") and st.groups == (64, 128) and st.l2_bytes == 2**20


def test_cli_hook_sets_run():
    p = argparse.ArgumentParser()
    B.add_arguments(p)
    assert p.parse_args([]).func is B.run


# -- derived columns, CSV, markdown, plot ---------------------------------------------------------


def synthetic_rows() -> list[dict]:
    """A small, made-up result set: times are invented, only the arithmetic is checked."""
    cases = _cases(shapes=((5120, 5120), (17408, 5120)), ms=(1, 2, 4, 8, 16))
    rows = []
    for c in cases:
        base = {"bf16": 20.0, "q2_0": 12.0, "w4a16": 15.0}[c.family] * (c.n / 5120)
        t = base * (1 + 0.1 * (c.m - 1)) * (1.5 if c.kernel == "q2_0_gemv" else 1.0)
        rows.append(
            B.case_row(
                c,
                time_us=t,
                time_min_us=0.98 * t,
                time_max_us=1.05 * t,
                repeats=9,
                calls_per_graph=34,
                copies=17,
                rotated_mib=124.5,
                check="ok" if c.family != "bf16" else "",
                timing="synthetic",
            )
        )
    B.derive(rows, ceiling_gbps=4400.0, sms=132, clock_hz=1.98e9)
    return rows


def test_derive_arithmetic():
    rows = synthetic_rows()
    by = {(r["family"], r["kernel"], r["n"], r["m"]): r for r in rows}
    r = by[("q2_0", "q2_0_gemv_vec_batchm", 5120, 4)]
    assert r["bytes"] == B.bytes_moved("q2_0", 5120, 5120, 4, 128)
    assert r["gbps"] == pytest.approx(r["bytes"] / (r["time_us"] * 1e-6) / 1e9)
    assert r["pct_read_ceiling"] == pytest.approx(100 * r["gbps"] / 4400.0)
    assert r["fma_floor_us"] == pytest.approx(4 * 0.78363, rel=1e-4)
    assert r["pct_fma_floor"] == pytest.approx(100 * r["fma_floor_us"] / r["time_us"])
    bf = by[("bf16", B.TORCH_KERNEL, 5120, 4)]
    assert r["bf16_us"] == bf["time_us"]
    assert r["speedup_vs_bf16"] == pytest.approx(bf["time_us"] / r["time_us"])
    m1 = by[("q2_0", "q2_0_gemv_vec", 5120, 1)]["time_us"]
    assert r["m1_x_m_us"] == pytest.approx(4 * m1)
    assert r["speedup_vs_m1_x_m"] == pytest.approx(4 * m1 / r["time_us"])
    assert bf["fma_floor_us"] is None and bf["speedup_vs_bf16"] == pytest.approx(1.0)
    w = by[("w4a16", "w4a16_gemv_batch8_rt2", 5120, 8)]
    assert w["m1_x_m_us"] is None and w["sms"] == 132 and w["clock_mhz"] == pytest.approx(1980)
    assert w["bytes_formula"] == B.BYTES_FORMULA["w4a16"]


def test_derive_leaves_untimed_rows_empty():
    c = _cases(shapes=((5120, 5120),), ms=(1,), kernels=("q2_0_gemv",), torch=False)[0]
    row = B.case_row(c, check="error: boom")
    B.derive([row], ceiling_gbps=None, sms=132, clock_hz=1.98e9)
    assert row["gbps"] is None and row["pct_read_ceiling"] is None and row["pct_fma_floor"] is None
    assert row["fma_floor_us"] == pytest.approx(0.78363, rel=1e-4) and row["bytes"] > 0


def test_csv_round_trip(tmp_path):
    rows = synthetic_rows()
    path = B.write_csv(rows, tmp_path / "x_gemv.csv")
    back = B.read_csv(path)
    assert len(back) == len(rows)
    header = path.read_text().splitlines()[0].split(",")
    assert tuple(header) == B.FIELDS
    for a, b in zip(rows, back, strict=True):
        for key in B.FIELDS:
            va, vb = a.get(key), b.get(key)
            if isinstance(va, float):
                assert vb == pytest.approx(va, rel=1e-5), key
            elif va is None or va == "":
                assert vb is None, key
            else:
                assert vb == va, key


def _report(rows):
    meta = {
        "date": "2026-01-01T00:00:00",
        "device": "NVIDIA H200 (synthetic)",
        "sms": 132,
        "clock_mhz": 1980.0,
        "clock_source": "device",
        "l2_bytes": 60 * 2**20,
        "l2_source": "device",
        "timing": "synthetic",
        "versions": "none",
        "read_ceiling_gbps": 4400.0,
        "read_ceiling_method": "numba_read16_gridstride (start of run)",
        "notes": [],
    }
    ceiling = [
        dict(
            phase="start",
            method="numba_read16_gridstride",
            bytes=2**31,
            time_us=488.0,
            gbps=4400.0,
            counted="read",
            timing="synthetic",
        )
    ]
    overhead = [
        dict(
            path=p,
            kernel="q2_0_gemv_vec",
            n=2048,
            k=2048,
            m=1,
            calls=200,
            batches=9,
            us_per_call=us,
            us_min=us,
        )
        for p, us in (("numba dispatcher", 28.0), ("pre-bound", 4.0))
    ]
    graph = [
        dict(kernel="q2_0_gemv_vec", n=5120, k=5120, m=1, ok=True, mismatches=0, elements=5120)
    ]
    return B.Report(rows=rows, meta=meta, ceiling=ceiling, overhead=overhead, graph_check=graph)


def test_outputs_and_markdown(tmp_path):
    p = argparse.ArgumentParser()
    B.add_arguments(p)
    args = p.parse_args(["--out", str(tmp_path), "--prefix", "t"])
    args.command = "python3 benchmarks/run_h200.py --out X"
    st = B.Settings.from_args(args)
    rep = _report(synthetic_rows())
    assert rep.ok
    paths = B.write_outputs(rep, st)
    for key in ("gemv", "ceiling", "overhead", "graph", "summary", "meta"):
        assert paths[key].exists() and paths[key].stat().st_size > 0
    md = paths["summary"].read_text()
    assert "python3 benchmarks/run_h200.py --out X" in md
    for want in (
        "N*(K/group)*(2+group/4)",
        "N*K/2 + N*K/16",
        "N*K*M / (SMs*128*clock)",
        "Host cost of one launch",
        "every tier at every M",
        "`w4a16_gemv_batch8_rt2` *",
        "vs M x M=1",
    ):
        assert want in md, want
    text = B.text_summary(rep.rows)
    assert len(text.splitlines()) == 1 + 2 * 5  # header + (2 shapes x 5 M)
    rep.rows[0]["check"] = "MISMATCH vs eager launch: 3/5120"
    assert not rep.ok


def test_progress_line():
    c = _cases(shapes=((5120, 5120),), ms=(1,), kernels=("q2_0_gemv_vec",), torch=False)[0]
    row = B.case_row(c, time_us=10.0, copies=17, calls_per_graph=34, check="ok")
    row.update(read_ceiling_gbps=4400.0, bf16_us=16.5)
    line = B.progress_line(3, 10, c, row)
    assert "[   3/10] q2_0 q2_0_gemv_vec 5120x5120 g128 M=1" in line
    assert "1.65x" in line and "check=ok" in line and "% of read" in line
    assert "(not timed)" in B.progress_line(1, 1, c, B.case_row(c))


def _plot_module():
    spec = importlib.util.spec_from_file_location(
        "q2gemv_bench_plot", ROOT / "benchmarks" / "plot.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_plots_from_a_synthetic_csv(tmp_path):
    pytest.importorskip("matplotlib")
    plot = _plot_module()
    csv_path = B.write_csv(synthetic_rows(), tmp_path / "s_gemv.csv")
    png = plot.plot(csv_path, tmp_path / "s_gemv.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    tiers = plot.plot_tiers(csv_path, tmp_path / "s_tiers.png")
    assert tiers is not None and tiers.stat().st_size > 0
    assert plot.main([str(csv_path), "--out", str(tmp_path / "again.png")]) == 0


def test_plot_of_an_untimed_csv(tmp_path):
    pytest.importorskip("matplotlib")
    plot = _plot_module()
    rows = [B.case_row(c) for c in _cases(shapes=((5120, 5120),), ms=(1, 2))]
    B.derive(rows, ceiling_gbps=None, sms=132, clock_hz=1.98e9)
    csv_path = B.write_csv(rows, tmp_path / "d_gemv.csv")
    assert plot.plot(csv_path, tmp_path / "d.png").stat().st_size > 0
    assert plot.plot_tiers(csv_path, tmp_path / "d_tiers.png") is None


# -- the subpackage's layering ------------------------------------------------------------

SRC = ROOT / "src" / "q2gemv"
# Each module of q2gemv.bench may import only those before it (lazily or not): no cycle.
BENCH_LAYERS = ("formulas", "matrix", "results", "plot", "timing", "runner", "command")


def _imported(path: Path) -> set[str]:
    """Every module ``path`` imports, anywhere in it, as absolute ``q2gemv...`` names."""
    import ast

    pkg = ["q2gemv", *path.relative_to(SRC).parent.parts]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = pkg[: len(pkg) - node.level + 1] if node.level else []
            mod = ".".join(base + ([node.module] if node.module else []))
            out.add(mod)
            out |= {f"{mod}.{a.name}" for a in node.names}
    return out


def test_bench_modules_import_only_the_layers_before_them():
    found = {p.stem for p in (SRC / "bench").glob("*.py")} - {"__init__"}
    assert found == set(BENCH_LAYERS)
    for i, name in enumerate(BENCH_LAYERS):
        bench_imports = {
            m.split(".")[2]
            for m in _imported(SRC / "bench" / f"{name}.py")
            if m.startswith("q2gemv.bench.")
        }
        assert bench_imports <= set(BENCH_LAYERS[:i]), (name, bench_imports)


def test_no_core_module_imports_the_bench():
    # cli.py is the command line (``q2gemv bench``); everything else is the core.
    for path in SRC.rglob("*.py"):
        rel = path.relative_to(SRC)
        if rel.parts[0] == "bench" or rel == Path("cli.py"):
            continue
        bad = {m for m in _imported(path) if m == "q2gemv.bench" or m.startswith("q2gemv.bench.")}
        assert not bad, (str(rel), bad)


def test_importing_the_bench_loads_no_numba():
    import subprocess
    import sys

    code = "import sys, q2gemv, q2gemv.bench; print('numba' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
