"""Roofline-style plots of a ``q2gemv bench`` CSV (matplotlib, imported only when drawing).

    q2gemv bench --plot ...                  # draws what the run measured, beside its CSV
    python3 benchmarks/plot.py benchmarks/results/h200_gemv.csv --out benchmarks/results/h200_gemv.png

One column per shape (N x K), three rows, M on a log2 axis:

1. GPU time per call (log): torch bf16 ``F.linear``, every Q2_0 kernel (the
   M=1 kernels as single points, and M x ``q2_0_gemv_vec``(M=1) dashed, the
   exact contract's ``q2_0_gemv_exact`` included), the W4A16 tier that dispatch
   picks, the NVFP4 exact contract's kernel; and the floors: each family's bytes / the
   measured read ceiling (dotted, same colour) and the fp32-FMA issue floor
   N*K*M / (SMs*128*clock) (grey). A kernel on its dotted line is at the
   memory roof; on the grey line, at the issue floor.
2. % of the streaming-read ceiling (effective GB/s / ceiling).
3. Speed-up over torch bf16 (> 1: faster than dense bf16).

With ``--tiers-out`` (run_h200.py writes it when tier rows exist), a second
figure: every W4A16 tier's time at every M it serves on the seed's shapes.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections import defaultdict
from pathlib import Path

from ..dispatch import registry
from .formulas import TORCH_KERNEL
from .matrix import GROUPED_FAMILIES, Q2_M1_REFERENCE
from .results import read_csv

BF16_STYLE = dict(color="black", marker="s")
FLOOR_COLOR = "0.55"


def _timed(r: dict) -> bool:
    t = r.get("time_us")
    return t is not None and math.isfinite(t) and t > 0


def _series(rows: list[dict]) -> dict[str, list[dict]]:
    """Label -> rows (sorted by M) of the series drawn in every panel."""
    out: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        label = _series_label(r)
        if label is not None:
            out[label].append(r)
    return {k: sorted(v, key=lambda r: r["m"]) for k, v in out.items()}


def _series_label(r: dict) -> str | None:
    """A row's series, by its role (:class:`~q2gemv.bench.matrix.Case`): bf16, each Q2_0 seed
    kernel, the W4A16 tier dispatch picks, each exact kernel; None: not drawn (a tier sweep)."""
    group = f" g{r['group']}" if r["family"] in GROUPED_FAMILIES else ""
    if r["kernel"] == TORCH_KERNEL:
        return "torch bf16 F.linear"
    if r.get("selected"):
        return "W4A16 dispatched tier"
    if r["role"] in ("m1", "batchm", "exact"):
        return f"{registry.family(r['family']).title} {r['kernel']}{group}"
    return None


def _m1_x_m(rows: list[dict]) -> dict[str, list[tuple[int, float]]]:
    out: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for r in rows:
        if r.get("m1_x_m_us") is not None and r["role"] == "batchm":  # the Q2_0 batched rows
            out[f"M x {Q2_M1_REFERENCE}(M=1) g{r['group']}"].append((r["m"], r["m1_x_m_us"]))
    return {k: sorted(set(v)) for k, v in out.items()}


def _floors(rows: list[dict]) -> dict[str, list[tuple[int, float]]]:
    """Memory floor per family (bytes / ceiling) and the FMA floor, per M, in us."""
    out: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for r in rows:
        ceil = r.get("read_ceiling_gbps")
        if ceil:
            label = f"{r['family']} bytes / read ceiling"
            if r["family"] in GROUPED_FAMILIES:
                label = f"{r['family']} g{r['group']} bytes / read ceiling"
            out[label].append((r["m"], r["bytes"] / (ceil * 1e9) * 1e6))
        if r.get("fma_floor_us") is not None:
            out["fp32 FMA issue floor"].append((r["m"], r["fma_floor_us"]))
    return {k: sorted(set(v)) for k, v in out.items()}


def _color_of(label: str, colors: dict[str, str], cycle: list[str]) -> str:
    """Series colours in order of appearance; a memory floor takes its family's colour."""
    if label.startswith(("torch", "bf16 ")):
        return "black"
    if label.endswith("read ceiling"):
        if label.startswith("w4a16"):
            return colors.get("W4A16 dispatched tier", FLOOR_COLOR)
        g = label.split()[1]  # "q2_0 g128 bytes / read ceiling": the batched kernel's colour
        q2 = [k for k in colors if k.startswith("Q2_0") and k.endswith(g)]
        best = next((k for k in q2 if "batchm" in k), q2[0] if q2 else None)
        return colors.get(best, FLOOR_COLOR)
    if label not in colors:
        colors[label] = cycle[len(colors) % len(cycle)]
    return colors[label]


def plot(csv_path: Path, png_path: Path, title: str = "q2gemv decode GEMV") -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_csv(csv_path)
    shapes = list(dict.fromkeys((r["n"], r["k"]) for r in rows))
    if not shapes:
        raise ValueError(f"{csv_path}: no rows")
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    colors: dict[str, str] = {}
    fig, axes = plt.subplots(
        3, len(shapes), figsize=(4.6 * len(shapes), 11), squeeze=False, sharex=True
    )
    any_timed = any(_timed(r) for r in rows)
    for col, (n, k) in enumerate(shapes):
        at = [r for r in rows if (r["n"], r["k"]) == (n, k)]
        ax_t, ax_p, ax_s = axes[0][col], axes[1][col], axes[2][col]
        for label, ser in _series(at).items():
            color = _color_of(label, colors, cycle)
            timed = [r for r in ser if _timed(r)]
            if not timed:
                continue
            style = dict(color=color, marker="o", ms=4, lw=1.5, label=label)
            if label.startswith("torch"):
                style.update(BF16_STYLE)
            ms = [r["m"] for r in timed]
            ls = "none" if len(ms) == 1 else "-"
            ax_t.plot(ms, [r["time_us"] for r in timed], ls=ls, **style)
            pct = [(r["m"], r["pct_read_ceiling"]) for r in timed if r.get("pct_read_ceiling")]
            if pct:
                ax_p.plot(*zip(*pct, strict=True), ls=ls, **style)
            sp = [(r["m"], r["speedup_vs_bf16"]) for r in timed if r.get("speedup_vs_bf16")]
            if sp and not label.startswith("torch"):
                ax_s.plot(*zip(*sp, strict=True), ls=ls, **style)
        for label, pts in _m1_x_m(at).items():
            ax_t.plot(*zip(*pts, strict=True), ls="--", color="0.3", lw=1, label=label)
        for label, pts in _floors(at).items():
            color = FLOOR_COLOR if "FMA" in label else _color_of(label, colors, cycle)
            ls = "-." if "FMA" in label else ":"
            ax_t.plot(*zip(*pts, strict=True), ls=ls, color=color, lw=1.2, label=label)
        ax_t.set_title(f"N x K = {n} x {k}")
        ax_s.axhline(1.0, color="black", lw=0.8)
        ax_p.axhline(100.0, color="black", lw=0.8)
        ms_here = sorted({r["m"] for r in at})
        for ax in (ax_t, ax_p, ax_s):
            ax.set_xscale("log", base=2)
            ax.set_xticks(ms_here, [str(m) for m in ms_here])
            ax.grid(True, which="both", alpha=0.3)
        if any_timed:
            ax_t.set_yscale("log")
        ax_s.set_xlabel("M (activation rows)")
        if not any_timed:
            ax_t.text(0.5, 0.5, "no timings (dry run)", transform=ax_t.transAxes, ha="center")
    axes[0][0].set_ylabel("GPU time per call (us)")
    axes[1][0].set_ylabel("% of streaming-read ceiling")
    axes[2][0].set_ylabel("speed-up vs torch bf16")
    handles, labels = {}, []
    for ax in axes[0]:
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            if lab not in handles:
                handles[lab] = h
                labels.append(lab)
    fig.legend(
        [handles[lab] for lab in labels],
        labels,
        loc="lower center",
        ncol=3,
        fontsize=8,
        frameon=False,
    )
    ceil = next((r.get("read_ceiling_gbps") for r in rows if r.get("read_ceiling_gbps")), None)
    dev = next((r.get("device") for r in rows if r.get("device")), "")
    sub = f"read ceiling {ceil:.0f} GB/s" if ceil else "read ceiling not measured"
    fig.suptitle(" - ".join(x for x in (title, dev, sub) if x), fontsize=11)
    n_leg_rows = math.ceil(len(labels) / 3)
    fig.tight_layout(rect=(0, 0.025 * n_leg_rows + 0.02, 1, 0.97))
    png_path = Path(png_path)
    png_path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png_path, dpi=110)
    plt.close(fig)
    return png_path


def plot_tiers(csv_path: Path, png_path: Path) -> Path | None:
    """Every W4A16 tier at every M it serves (role ``tier``), one panel per shape; None if none."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in read_csv(csv_path) if "tier" in r["role"]]  # W4A16 seed tiers only
    rows = [r for r in rows if _timed(r)]
    if not rows:
        return None
    shapes = list(dict.fromkeys((r["n"], r["k"]) for r in rows))
    fig, axes = plt.subplots(1, len(shapes), figsize=(5.5 * len(shapes), 4.2), squeeze=False)
    for col, (n, k) in enumerate(shapes):
        ax = axes[0][col]
        at = [r for r in rows if (r["n"], r["k"]) == (n, k)]
        for name in dict.fromkeys(r["kernel"] for r in at):
            ser = sorted((r for r in at if r["kernel"] == name), key=lambda r: r["m"])
            ax.plot(
                [r["m"] for r in ser],
                [r["time_us"] for r in ser],
                marker="o",
                ms=4,
                label=name.replace("w4a16_gemv_", ""),
            )
        picked = sorted((r for r in at if r.get("selected")), key=lambda r: r["m"])
        ax.plot(
            [r["m"] for r in picked],
            [r["time_us"] for r in picked],
            ls="none",
            marker="*",
            ms=11,
            color="black",
            label="dispatch pick",
        )
        ax.set_title(f"W4A16 tiers, N x K = {n} x {k}")
        ax.set_xlabel("M")
        ax.set_ylabel("GPU time per call (us)")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png_path, dpi=110)
    plt.close(fig)
    return Path(png_path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("csv", type=Path, help="a PREFIX_gemv.csv written by q2gemv bench")
    p.add_argument("--out", type=Path, help="PNG path (default: the CSV's with .png)")
    p.add_argument("--tiers-out", type=Path, help="also plot the W4A16 tier sweep here")
    p.add_argument("--title", default="q2gemv decode GEMV")
    args = p.parse_args(argv)
    out = plot(args.csv, args.out or args.csv.with_suffix(".png"), args.title)
    print(f"wrote {out}")
    if args.tiers_out:
        t = plot_tiers(args.csv, args.tiers_out)
        print(f"wrote {t}" if t else "no timed W4A16 tier rows: tier plot skipped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
