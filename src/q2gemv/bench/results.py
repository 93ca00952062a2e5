"""Result rows of ``q2gemv bench``: derived columns, CSV, tables, the summary and the output files (pure).

Imports :mod:`q2gemv.bench.formulas` and :mod:`q2gemv.bench.matrix` only.
"""

from __future__ import annotations

import csv
import datetime as _dt
import json
import math
import os
import platform
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..tools import atomic as _atomic
from .formulas import (
    BYTES_FORMULA,
    FMA_FLOOR_FORMULA,
    L2_ROTATE_FACTOR,
    TORCH_KERNEL,
    bytes_moved,
    fma_floor_s,
)
from .matrix import Q2_M1_REFERENCE, W4A16_SWEEP_SHAPES, Case, Settings

DEFAULT_OUT = "q2gemv-bench"
SIM_PREFIX = "simulator"


# -- result rows: derivation, CSV (pure) ---------------------------------------------

FIELDS = (
    "family",
    "kernel",
    "role",
    "selected",
    "n",
    "k",
    "m",
    "group",
    "launches_per_call",
    "time_us",
    "time_min_us",
    "time_max_us",
    "repeats",
    "calls_per_graph",
    "copies",
    "rotated_mib",
    "bytes",
    "gbps",
    "read_ceiling_gbps",
    "pct_read_ceiling",
    "fma_floor_us",
    "pct_fma_floor",
    "bf16_us",
    "speedup_vs_bf16",
    "m1_x_m_us",
    "speedup_vs_m1_x_m",
    "check",
    "timing",
    "bytes_formula",
    "sms",
    "clock_mhz",
    "device",
)
INT_FIELDS = {"n", "k", "m", "group", "launches_per_call", "repeats", "calls_per_graph", "copies"}
INT_FIELDS |= {"bytes", "sms"}
TEXT_FIELDS = {"family", "kernel", "role", "check", "timing", "bytes_formula", "device"}
FLOAT_FIELDS = set(FIELDS) - INT_FIELDS - TEXT_FIELDS - {"selected"}  # "selected": a bool


def case_row(case: Case, **measured) -> dict:
    """A result row for ``case`` with its identity filled in and ``measured`` merged."""
    row = dict.fromkeys(FIELDS)
    row.update(
        family=case.family,
        kernel=case.kernel,
        role=case.role,
        selected=case.selected,
        n=case.n,
        k=case.k,
        m=case.m,
        group=case.group,
        launches_per_call=len(case.launches),
        bytes_formula=BYTES_FORMULA[case.family],
    )
    row.update(measured)
    return row


def _is_bf16(row: dict) -> bool:
    """The torch ``F.linear`` baseline's row (family bf16, role bf16)."""
    return row["kernel"] == TORCH_KERNEL


def _by_family(rows: Iterable[dict]) -> dict[str, list[dict]]:
    """``family -> its rows`` in their order: a report section looks its family's rows up here.

    Roles name the rest: ``batchm`` rows are the batched Q2_0 kernels, ``tier`` and
    ``tier+dispatch`` rows the W4A16 tiers, ``selected`` the W4A16 tier dispatch picks
    (:class:`~q2gemv.bench.matrix.Case`).
    """
    out: dict[str, list[dict]] = {}
    for r in rows:
        out.setdefault(r["family"], []).append(r)
    return out


def _ratio(num, den):
    if num is None or den is None or not den or not math.isfinite(num) or not math.isfinite(den):
        return None
    return num / den


def derive(
    rows: list[dict],
    *,
    ceiling_gbps: float | None,
    sms: int | None,
    clock_hz: float | None,
    device: str | None = None,
) -> None:
    """Fill the derived columns of ``rows`` in place (rows without a time get None).

    ``sms`` / ``clock_hz`` None (the simulator has neither): no FMA floor.

    bytes, GB/s, % of the read ceiling, the FMA floor (not for bf16: cuBLAS
    may use tensor cores), the bf16 time of the same (N, K, M) and the
    speed-up over it, and for Q2_0 batchm the M x (M=1 ``q2_0_gemv_vec``)
    time of the same (N, K, group) and the speed-up over it (every batched
    Q2_0 kernel, role ``batchm``).
    """
    bf16 = {(r["n"], r["k"], r["m"]): r.get("time_us") for r in rows if _is_bf16(r)}
    m1 = {
        (r["n"], r["k"], r["group"]): r.get("time_us")
        for r in rows
        if r["kernel"] == Q2_M1_REFERENCE and r["m"] == 1
    }
    for r in rows:
        n, k, m = r["n"], r["k"], r["m"]
        t = r.get("time_us")
        t = t if t is not None and math.isfinite(t) else None
        r["bytes"] = bytes_moved(r["family"], n, k, m, r["group"])
        r["bytes_formula"] = BYTES_FORMULA[r["family"]]
        r["sms"] = sms
        r["clock_mhz"] = None if clock_hz is None else clock_hz / 1e6
        r["device"] = device
        r["read_ceiling_gbps"] = ceiling_gbps
        r["gbps"] = None if t is None else r["bytes"] / (t * 1e-6) / 1e9
        r["pct_read_ceiling"] = None
        if r["gbps"] is not None and ceiling_gbps:
            r["pct_read_ceiling"] = 100.0 * r["gbps"] / ceiling_gbps
        if _is_bf16(r) or not sms or not clock_hz:
            r["fma_floor_us"] = r["pct_fma_floor"] = None
        else:
            r["fma_floor_us"] = fma_floor_s(n, k, m, sms, clock_hz) * 1e6
            r["pct_fma_floor"] = None if t is None else 100.0 * r["fma_floor_us"] / t
        r["bf16_us"] = bf16.get((n, k, m))
        r["speedup_vs_bf16"] = _ratio(r["bf16_us"], t)
        r["m1_x_m_us"] = r["speedup_vs_m1_x_m"] = None
        if r["role"] == "batchm":
            base = m1.get((n, k, r["group"]))
            if base is not None and math.isfinite(base):
                r["m1_x_m_us"] = m * base
                r["speedup_vs_m1_x_m"] = _ratio(r["m1_x_m_us"], t)


def _fmt_cell(v) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, float):
        return "" if not math.isfinite(v) else f"{v:.6g}"
    return str(v)


def write_csv(rows: Iterable[dict], path: Path, fields: Sequence[str] = FIELDS) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with _atomic.atomic_write(path, text=True, newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(fields), extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: _fmt_cell(r.get(k)) for k in fields})
    return path


def read_csv(path: Path) -> list[dict]:
    """Rows of a CSV written by :func:`write_csv`, numbers typed, empty cells None."""
    rows = []
    with open(path, newline="") as f:
        for raw in csv.DictReader(f):
            r: dict = {}
            for key, v in raw.items():
                if v == "" or v is None:
                    r[key] = None
                elif key in INT_FIELDS:
                    r[key] = int(float(v))
                elif key in FLOAT_FIELDS:
                    r[key] = float(v)
                elif key == "selected":
                    r[key] = v == "1"
                else:
                    r[key] = v
            rows.append(r)
    return rows


# -- tables (pure) ---------------------------------------------------------------------


def _f(v, spec: str = ".1f", suffix: str = "") -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    return f"{v:{spec}}{suffix}"


def md_table(headers: Sequence[str], body: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "| " + " | ".join("---" for _ in headers) + " |"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in body]
    return "\n".join(lines)


def _shapes_of(rows: list[dict]) -> list[tuple[int, int]]:
    return list(dict.fromkeys((r["n"], r["k"]) for r in rows))


def _perf_cells(r: dict) -> list[str]:
    return [
        _f(r.get("time_us"), ".1f"),
        _f(r.get("gbps"), ".0f"),
        _f(r.get("pct_read_ceiling"), ".0f", "%"),
        _f(r.get("fma_floor_us"), ".1f"),
        _f(r.get("pct_fma_floor"), ".0f", "%"),
        _f(r.get("bf16_us"), ".1f"),
        _f(r.get("speedup_vs_bf16"), ".2f", "x"),
    ]


PERF_HEADERS = ["us", "GB/s", "% read ceiling", "FMA floor us", "% of floor", "bf16 us", "vs bf16"]


def q2_m1_table(rows: list[dict]) -> str:
    """Q2_0 at M=1: baseline vs vec vs batchm, per shape and group."""
    body = []
    for r in _by_family(rows).get("q2_0", ()):
        if r["m"] == 1:
            body.append(
                [f"{r['n']}x{r['k']}", f"g{r['group']}", f"`{r['kernel']}`"] + _perf_cells(r)
            )
    return md_table(["N x K", "group", "kernel"] + PERF_HEADERS, body)


def q2_batchm_table(rows: list[dict]) -> str:
    """The batched Q2_0 kernels at every M vs M x (the M=1 kernel ``q2_0_gemv_vec``)."""
    body = []
    for r in rows:
        if r["role"] == "batchm":
            body.append(
                [f"{r['n']}x{r['k']}", f"g{r['group']}", f"`{r['kernel']}`", str(r["m"])]
                + [str(r["launches_per_call"])]
                + _perf_cells(r)
                + [_f(r.get("m1_x_m_us"), ".1f"), _f(r.get("speedup_vs_m1_x_m"), ".2f", "x")]
            )
    return md_table(
        ["N x K", "group", "kernel", "M", "launches"]
        + PERF_HEADERS
        + [f"M x {Q2_M1_REFERENCE}(M=1) us", "vs M x M=1"],
        body,
    )


def w4a16_tier_table(
    rows: list[dict], shapes: Sequence[tuple[int, int]] = W4A16_SWEEP_SHAPES
) -> str:
    """W4A16: every tier at every M it serves, on the seed's shapes (* = what dispatch picks)."""
    body = []
    want = {tuple(s) for s in shapes}
    for r in rows:
        if (r["n"], r["k"]) in want and "tier" in (r["role"] or ""):
            name = f"`{r['kernel']}`" + (" *" if r.get("selected") else "")
            body.append([f"{r['n']}x{r['k']}", name, str(r["m"])] + _perf_cells(r))
    return md_table(["N x K", "tier", "M"] + PERF_HEADERS, body)


def _fastest(rows: list[dict]) -> dict | None:
    """The row with the least time; None when no row was timed (a dry run names no winner)."""
    timed = [r for r in rows if r.get("time_us") is not None and math.isfinite(r["time_us"])]
    return min(timed, key=lambda r: r["time_us"]) if timed else None


def headline_rows(rows: list[dict]) -> list[dict]:
    """Per (shape, M): bf16, the fastest Q2_0 kernel (any group, either contract) and the faster
    of the W4A16 tier dispatch picks and the NVFP4 exact kernel (the tier when none was timed)."""
    out = []
    for n, k in _shapes_of(rows):
        sel = [r for r in rows if (r["n"], r["k"]) == (n, k)]
        for m in sorted({r["m"] for r in sel}):
            at = [r for r in sel if r["m"] == m]
            fam = _by_family(at)
            bf = next((r for r in at if _is_bf16(r)), None)
            q2 = _fastest(fam.get("q2_0", []))
            picked = [r for r in fam.get("w4a16", ()) if r.get("selected")]
            exact = [r for r in fam.get("w4a16", ()) if r["role"] == "exact"]
            w4 = _fastest(picked + exact) or next(iter(picked + exact), None)
            out.append(dict(n=n, k=k, m=m, bf16=bf, q2=q2, w4=w4))
    return out


def headline_table(rows: list[dict]) -> str:
    body = []
    for h in headline_rows(rows):
        q2, w4, bf = h["q2"] or {}, h["w4"] or {}, h["bf16"] or {}
        body.append(
            [
                f"{h['n']}x{h['k']}",
                str(h["m"]),
                _f(bf.get("time_us")),
                f"`{q2['kernel']}`" if q2 else "-",
                _f(q2.get("time_us")),
                _f(q2.get("pct_read_ceiling"), ".0f", "%"),
                _f(q2.get("pct_fma_floor"), ".0f", "%"),
                _f(q2.get("speedup_vs_bf16"), ".2f", "x"),
                f"`{w4['kernel']}`" if w4 else "-",
                _f(w4.get("time_us")),
                _f(w4.get("pct_read_ceiling"), ".0f", "%"),
                _f(w4.get("pct_fma_floor"), ".0f", "%"),
                _f(w4.get("speedup_vs_bf16"), ".2f", "x"),
            ]
        )
    return md_table(
        [
            "N x K",
            "M",
            "bf16 us",
            "fastest Q2_0",
            "us",
            "% ceil",
            "% floor",
            "vs bf16",
            "NVFP4 kernel",
            "us",
            "% ceil",
            "% floor",
            "vs bf16",
        ],
        body,
    )


def text_summary(rows: list[dict]) -> str:
    """The short stdout table: per (shape, M) bf16 vs the fastest Q2_0 vs NVFP4 (:func:`headline_rows`)."""
    lines = [
        f"{'N x K':>11} {'M':>3} {'bf16 us':>8} {'fastest Q2_0':>22} {'us':>8} {'x bf16':>6} "
        f"{'%ceil':>5} {'NVFP4 kernel':>14} {'us':>8} {'x bf16':>6} {'%ceil':>5}"
    ]
    for h in headline_rows(rows):
        q2, w4, bf = h["q2"] or {}, h["w4"] or {}, h["bf16"] or {}
        lines.append(
            f"{h['n']:>5}x{h['k']:<5} {h['m']:>3} {_f(bf.get('time_us')):>8} "
            f"{(q2.get('kernel') or '-').replace('q2_0_gemv', 'q2'):>22} "
            f"{_f(q2.get('time_us')):>8} {_f(q2.get('speedup_vs_bf16'), '.2f'):>6} "
            f"{_f(q2.get('pct_read_ceiling'), '.0f'):>5} "
            f"{(w4.get('kernel') or '-').replace('w4a16_gemv_', ''):>14} "
            f"{_f(w4.get('time_us')):>8} {_f(w4.get('speedup_vs_bf16'), '.2f'):>6} "
            f"{_f(w4.get('pct_read_ceiling'), '.0f'):>5}"
        )
    return "\n".join(lines)


def progress_line(i: int, total: int, case: Case, row: dict) -> str:
    t = row.get("time_us")
    parts = [f"[{i:>4}/{total}] {case.label}:"]
    if t is None:
        parts.append("(not timed)")
    else:
        parts.append(f"{t:9.2f} us")
        n, k, m, g = case.n, case.k, case.m, case.group
        gbps = bytes_moved(case.family, n, k, m, g) / (t * 1e-6) / 1e9
        parts.append(f"{gbps:7.0f} GB/s")
        ceil = row.get("read_ceiling_gbps")
        if ceil:
            parts.append(f"({100 * gbps / ceil:3.0f}% of read)")
        bf = row.get("bf16_us")
        if bf and case.kernel != TORCH_KERNEL:
            parts.append(f"bf16 {bf:.1f} us -> {bf / t:.2f}x")
    if row.get("copies"):
        parts.append(f"[{row['copies']} copies, {row.get('calls_per_graph')} calls]")
    if row.get("check"):
        parts.append(f"check={row['check']}")
    return " ".join(parts)


# -- outputs ------------------------------------------------------------------------------


@dataclass
class Report:
    """Everything one run measured."""

    rows: list[dict]
    meta: dict
    ceiling: list[dict] = field(default_factory=list)
    overhead: list[dict] = field(default_factory=list)
    graph_check: list[dict] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        bad = [r for r in self.rows if r.get("check") not in (None, "", "ok")]
        bad += [g for g in self.graph_check if not g.get("ok")]
        return not bad

    def summary_lines(self) -> list[str]:
        out = []
        if self.meta.get("read_ceiling_gbps"):
            out.append(
                f"read ceiling: {self.meta['read_ceiling_gbps']:.0f} GB/s "
                f"({self.meta.get('read_ceiling_method')})"
            )
        for o in self.overhead:
            verdict = ""
            if o["path"] == PREBOUND_PATH:
                ok = o["us_per_call"] <= PREBOUND_TARGET_US
                verdict = f" (target <= {PREBOUND_TARGET_US:g} us: {'met' if ok else 'NOT met'})"
            out.append(
                f"host launch {o['path']:<22} {o['kernel']:<24} {o['us_per_call']:7.2f} us/call"
                + verdict
            )
        for g in self.graph_check:
            out.append(
                f"graph capture of pre-bound {g['kernel']}: "
                + ("bit-equal to eager" if g["ok"] else f"FAILED ({g.get('detail')})")
            )
        bad = [r for r in self.rows if r.get("check") not in (None, "", "ok")]
        if bad:
            out.append(
                f"{len(bad)} case(s) failed their check: "
                + ", ".join(
                    f"{r['kernel']} {r['n']}x{r['k']} M={r['m']}: {r['check']}" for r in bad[:5]
                )
            )
        for note in self.meta.get("notes", []):
            out.append(f"note: {note}")
        return out


PREBOUND_PATH = "pre-bound"
PREBOUND_TARGET_US = 8.0  # the bound on the host cost of a pre-bound launch
CEILING_FIELDS = ("phase", "method", "bytes", "time_us", "gbps", "counted", "timing")
OVERHEAD_FIELDS = ("path", "kernel", "n", "k", "m", "calls", "batches", "us_per_call", "us_min")
GRAPH_FIELDS = ("kernel", "n", "k", "m", "ok", "mismatches", "elements", "detail")


def summary_markdown(report: Report, st: Settings) -> str:
    meta = report.meta
    rows = report.rows
    if meta.get("simulated") or meta.get("dry_run"):
        where = "the CUDA simulator" if meta.get("simulated") else meta.get("device", "?")
        facts = (
            f"DRY RUN on {where}: every case launched once and checked bit for bit; "
            "NOTHING WAS TIMED. These are not measurements."
        )
    else:
        facts = (
            f"{meta.get('device', '?')}: {meta.get('sms')} SMs, "
            f"clock {meta.get('clock_mhz') or 0:.0f} MHz ({meta.get('clock_source')}), "
            f"L2 {meta.get('l2_bytes', 0) / 2**20:.0f} MiB ({meta.get('l2_source')}). "
            f"Timing: {meta.get('timing')}; median of {st.repeats} repeats; "
            f"cold weights rotated over > {L2_ROTATE_FACTOR} x L2."
        )
    title = "# q2gemv decode GEMV benchmark" + (
        " (dry run, not timed)" if meta.get("simulated") or meta.get("dry_run") else ""
    )
    parts = [
        title,
        "",
        "Made by:",
        "",
        "```",
        st.command,
        "```",
        "",
        f"{meta.get('date', '')}, {facts} Versions: {meta.get('versions')}.",
        "",
        "Bytes moved: " + "; ".join(f"{k}: `{v}`" for k, v in BYTES_FORMULA.items()) + ". "
        f"FMA issue floor: `{FMA_FLOOR_FORMULA}`; '% of floor' = 100 x floor / time. "
        "'% read ceiling' = effective GB/s / the streaming-read ceiling below. "
        "'vs bf16' = torch bf16 `F.linear` time / kernel time (> 1: faster).",
        "",
        "## Streaming-read ceiling (same run)",
        "",
        md_table(
            ["phase", "method", "bytes", "us", "GB/s", "counted"],
            [
                [
                    c["phase"],
                    c["method"],
                    str(c["bytes"]),
                    _f(c.get("time_us")),
                    _f(c.get("gbps"), ".0f"),
                    c["counted"],
                ]
                for c in report.ceiling
            ],
        ),
        "",
        f"Ceiling used: {_f(meta.get('read_ceiling_gbps'), '.0f')} GB/s "
        f"({meta.get('read_ceiling_method')}).",
        "",
    ]
    if report.overhead:
        parts += [
            "## Host cost of one launch",
            "",
            f"Back-to-back launches timed on the host (perf_counter), median of batches; "
            f"target for the pre-bound path: <= {PREBOUND_TARGET_US:g} us per call.",
            "",
            md_table(
                ["path", "kernel", "N x K", "M", "us / call (median)", "min"],
                [
                    [
                        o["path"],
                        f"`{o['kernel']}`",
                        f"{o['n']}x{o['k']}",
                        str(o["m"]),
                        _f(o["us_per_call"], ".2f"),
                        _f(o["us_min"], ".2f"),
                    ]
                    for o in report.overhead
                ],
            ),
            "",
        ]
    if report.graph_check:
        parts += [
            "## Pre-bound launches in a torch CUDA graph (external stream) vs eager",
            "",
            md_table(
                ["kernel", "N x K", "M", "bit-equal", "detail"],
                [
                    [
                        f"`{g['kernel']}`",
                        f"{g['n']}x{g['k']}",
                        str(g["m"]),
                        "yes" if g["ok"] else "NO",
                        g.get("detail") or "",
                    ]
                    for g in report.graph_check
                ],
            ),
            "",
        ]
    parts += ["## Per shape and M", "", headline_table(rows), ""]
    if any(r["m"] == 1 for r in _by_family(rows).get("q2_0", ())):
        parts += [
            "## Q2_0 at M=1: every kernel (baseline, vec, batchm, ...)",
            "",
            q2_m1_table(rows),
            "",
        ]
    if any(r["role"] == "batchm" for r in rows):
        parts += [
            f"## Batched Q2_0 kernels vs M x {Q2_M1_REFERENCE} (M=1)",
            "",
            q2_batchm_table(rows),
            "",
        ]
    if any("tier" in (r["role"] or "") for r in rows):
        parts += [
            "## W4A16: every tier at every M it serves (* = the tier dispatch picks)",
            "",
            w4a16_tier_table(rows),
            "",
        ]
    for note in meta.get("notes", []):
        parts.append(f"* note: {note}")
    return "\n".join(parts) + "\n"


def device_prefix(meta: dict) -> str:
    """Default file prefix: a slug of the device name ('NVIDIA H200' -> 'h200'),
    :data:`SIM_PREFIX` under the simulator, ``_dryrun`` appended when nothing was timed."""
    if meta.get("simulated"):
        return SIM_PREFIX
    name = re.sub(r"^nvidia\s+", "", str(meta.get("device") or "gpu").strip(), flags=re.I)
    slug = re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_") or "gpu"
    return slug + ("_dryrun" if meta.get("dry_run") else "")


OUTPUT_SUFFIXES = (
    "_gemv.csv",
    "_ceiling.csv",
    "_launch_overhead.csv",
    "_graph_check.csv",
    "_summary.md",
    "_run.json",
    "_gemv.png",
    "_w4a16_tiers.png",
)


def free_prefix(out: Path, prefix: str) -> str:
    """``prefix``, or ``prefix_2``, ``prefix_3``, ... : the first with no output file in ``out``."""
    cand, i = prefix, 1
    while any((out / f"{cand}{suf}").exists() for suf in OUTPUT_SUFFIXES):
        i += 1
        cand = f"{prefix}_{i}"
    return cand


def write_outputs(report: Report, st: Settings) -> dict[str, Path]:
    """Write the CSVs, summary and run JSON; never replaces a file unless ``st.overwrite``.

    ``st.prefix`` None takes :func:`device_prefix`; when files of the prefix
    exist (and not ``overwrite``) the first free ``prefix_N`` is used, with a
    note. ``st.prefix`` is set to the prefix written.
    """
    out = st.out
    wanted = st.prefix or device_prefix(report.meta)
    p = wanted if st.overwrite else free_prefix(out, wanted)
    if p != wanted:
        report.meta.setdefault("notes", []).append(
            f"{out}/{wanted}_* exists: wrote {p}_* instead (--overwrite replaces)"
        )
    st.prefix = p
    out.mkdir(parents=True, exist_ok=True)
    paths = {
        "gemv": write_csv(report.rows, out / f"{p}_gemv.csv"),
        "ceiling": write_csv(report.ceiling, out / f"{p}_ceiling.csv", CEILING_FIELDS),
    }
    if report.overhead:
        paths["overhead"] = write_csv(
            report.overhead, out / f"{p}_launch_overhead.csv", OVERHEAD_FIELDS
        )
    if report.graph_check:
        paths["graph"] = write_csv(report.graph_check, out / f"{p}_graph_check.csv", GRAPH_FIELDS)
    md = out / f"{p}_summary.md"
    _atomic.write_text(md, summary_markdown(report, st))
    paths["summary"] = md
    js = out / f"{p}_run.json"
    _atomic.write_text(
        js, json.dumps({**report.meta, "command": st.command}, indent=2, default=str) + "\n"
    )
    paths["meta"] = js
    return paths


def base_meta(st: Settings) -> dict:
    """Run facts known without a device."""
    return {
        "date": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "host": platform.node(),
        "python": platform.python_version(),
        "shapes": [f"{n}x{k}" for n, k in st.shapes],
        "ms": list(st.ms),
        "groups": list(st.groups),
        "repeats": st.repeats,
        "warmup": st.warmup,
        "min_calls": st.min_calls,
        "dry_run": st.dry_run,
        "env_switches": {
            k: os.environ[k]
            for k in (
                "Q2GEMV_NO_GEMV_EXACT_M_TIERS",
                "ATLAS_NO_GEMV_EXACT_M_TIERS",
                "Q2GEMV_NO_BATCH8_RT",
                "ATLAS_NO_BATCH8_RT",
            )
            if k in os.environ
        },
        "started": time.time(),
        "notes": list(st.notes),
    }
