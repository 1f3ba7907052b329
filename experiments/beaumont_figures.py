"""Beaumont et al. (2020) Fig. 7, 8 and 9 by simulation (uf = ub = ut = 1), from the join DP.

    python -m experiments.beaumont_figures            # print the numbers and the paper's claims
    python -m experiments.beaumont_figures --write    # also write paper_figures/beaumont_fig{7,8,9}.{csv,png}
                                                      # and beaumont_figures.json (commit and command)
    python -m experiments.beaumont_figures --render   # only the PNGs, from the CSVs

Fig. 7: makespan / optimal makespan against slots / C_opt for SNN (2L, 2L, 2L), CM (L, 5L) and a chain
of 6L (RNN), at L = 5 and 15, from c_min to C_opt. All three share the optimal makespan 12L + 1.
Fig. 8: the dual, makespan / (12L + 1) against L for the same three models with c = 9 and 13 slots.
Fig. 9: makespan of Equiv-Chain / optimal on SNN graphs (2L, 2L, 2L) with 9, 12 and 15 slots, against
the graph's length 2L + 1.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from recompute.planners.pebble import c_min, c_opt, equiv_chain, join_table

from .runner import git_commit

OUT = Path(__file__).resolve().parents[1] / "paper_figures"
FIG7_L = (5, 15)
FIG8_L = tuple(range(1, 21))
FIG8_SLOTS = (9, 13)
FIG9_L = tuple(range(1, 21))
FIG9_SLOTS = (9, 12, 15)
COMMAND = "python -m experiments.beaumont_figures --write"
MODELS = {"SNN (2L,2L,2L)": lambda L: (2 * L,) * 3, "CM (L,5L)": lambda L: (L, 5 * L), "chain 6L": lambda L: (6 * L,)}


def _opt(lengths: tuple[int, ...], cmax: int, table_lengths: tuple[int, ...]) -> np.ndarray:
    """Opt_join(lengths, c) for c = 0..cmax, read from the (cached) table of the largest instance."""
    return join_table(table_lengths, cmax)[0][lengths][: cmax + 1]


def figure7() -> pd.DataFrame:
    """One row per (L, model, slots) from c_min to C_opt."""
    rows = []
    for name, shape in MODELS.items():
        big = shape(max(FIG7_L))
        for L in FIG7_L:
            ls, best = shape(L), 12 * L + 1
            top = c_opt(ls)
            ms = _opt(ls, c_opt(big), big)
            for c in range(c_min(ls), top + 1):
                rows.append(dict(L=L, model=name, lengths=str(ls), slots=c, c_opt=top, mem_ratio=c / top,
                                 makespan=ms[c], opt_makespan=best, ratio=ms[c] / best))
    return pd.DataFrame(rows)


def figure8() -> pd.DataFrame:
    """One row per (slots, model, L) where the model runs in ``slots`` (c ≥ c_min): makespan / (12L + 1)."""
    rows = []
    for name, shape in MODELS.items():
        big = shape(max(FIG8_L))
        for c in FIG8_SLOTS:
            for L in FIG8_L:
                ls = shape(L)
                if c < c_min(ls):
                    continue
                ms = _opt(ls, max(FIG8_SLOTS), big)[c]
                rows.append(dict(slots=c, model=name, L=L, makespan=ms, opt_makespan=12 * L + 1, ratio=ms / (12 * L + 1)))
    return pd.DataFrame(rows)


def figure9() -> pd.DataFrame:
    """One row per (slots, L): Equiv-Chain's makespan over the optimum on (2L, 2L, 2L)."""
    big = (2 * max(FIG9_L),) * 3
    rows = []
    for c in FIG9_SLOTS:
        for L in FIG9_L:
            ls = (2 * L,) * 3
            opt = _opt(ls, max(FIG9_SLOTS), big)[c]
            eq = equiv_chain(ls, c).makespan
            rows.append(dict(slots=c, L=L, length=2 * L + 1, equiv_chain=eq, optimal=opt, ratio=eq / opt))
    return pd.DataFrame(rows)


def halving(df7: pd.DataFrame) -> pd.DataFrame:
    """The paper's claim (§4a): at half of C_opt the makespan is ≈ 25% above optimal; also c_min + 2."""
    rows = []
    for (L, model), d in df7.groupby(["L", "model"], sort=False):
        rows.append(dict(L=L, model=model, at_half=float(np.interp(0.5, d.mem_ratio, d.ratio)),
                         at_cmin_plus_2=float(d.ratio.iloc[2]), at_cmin=float(d.ratio.iloc[0])))
    return pd.DataFrame(rows)


def _save(fig: Any, path: Path, stamp: str) -> None:
    """Lay out, stamp with where the data came from, write (no software tag: the PNG depends on the data alone)."""
    import matplotlib.pyplot as plt

    fig.tight_layout(rect=(0, 0.03, 1, 1))
    fig.text(0.01, 0.005, stamp, fontsize=6, color="0.4")
    fig.savefig(path, dpi=130, metadata={"Software": None})
    plt.close(fig)


def plot7(df7: pd.DataFrame, path: Path, stamp: str) -> None:
    import matplotlib.pyplot as plt

    top = 3.0  # the few slots next to c_min go far higher; they are written at the top edge instead
    fig, axes = plt.subplots(1, len(FIG7_L), figsize=(11, 4.4), sharey=True)
    for ax, L in zip(axes, FIG7_L):
        for (name, d), mark in zip(df7[df7.L == L].groupby("model", sort=False), "os^"):
            line, = ax.plot(d.mem_ratio, d.ratio, marker=mark, ms=3.5, lw=1.2, label=f"{name}: c ≥ {d.slots.min()}")
            off = d[d.ratio > top]
            if len(off):
                text = ", ".join(f"{r:.1f}" for r in off.ratio)
                ax.text(0.25, 0.95 - 0.065 * list(MODELS).index(name),
                        f"off scale: {text} at c = {', '.join(map(str, off.slots))}",
                        transform=ax.transAxes, fontsize=8, color=line.get_color(), va="top")
        ax.axvline(0.5, color="grey", ls=":", lw=1)
        ax.axhline(1.25, color="grey", ls="--", lw=1, label="paper: +25% at half memory")
        ax.set(title=f"({'ab'[FIG7_L.index(L)]}) L = {L}", xlabel="memory slots c / C_opt", xlim=(0, 1.02),
               ylim=(0.95, top))
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("makespan / optimal makespan (12L + 1)")
    axes[1].legend(fontsize=8, loc="center right")
    fig.suptitle("Beaumont et al. (2020) Fig. 7 by simulation: optimal join DP, uf = ub = ut = 1")
    _save(fig, path, stamp)


def plot8(df8: pd.DataFrame, path: Path, stamp: str) -> None:
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(FIG8_SLOTS), figsize=(11, 4.2), sharey=True)
    for ax, c in zip(axes, FIG8_SLOTS):
        for (name, d), mark in zip(df8[df8.slots == c].groupby("model", sort=False), "os^"):
            ax.plot(d.L, d.ratio, marker=mark, ms=3.5, lw=1.2, label=name)
        ax.set(title=f"({'ab'[FIG8_SLOTS.index(c)]}) c = {c} slots", xlabel="L")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("makespan / optimal makespan (12L + 1)")
    axes[0].legend(fontsize=8)
    fig.suptitle("Beaumont et al. (2020) Fig. 8 by simulation: optimal join DP at fixed memory, uf = ub = ut = 1")
    _save(fig, path, stamp)


def plot9(df9: pd.DataFrame, path: Path, stamp: str) -> None:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for (c, d), mark in zip(df9.groupby("slots"), "os^"):
        ax.plot(d.length, d.ratio, marker=mark, ms=3.5, lw=1.2, label=f"c = {c} slots")
    ax.set(xlabel="graph length 2L + 1 (SNN, branches of 2L)", ylabel="makespan Equiv-Chain / optimal",
           title="Beaumont et al. (2020) Fig. 9b by simulation")
    ax.grid(alpha=0.3)
    ax.legend()
    _save(fig, path, stamp)


def render(out: Path = OUT) -> None:
    """``beaumont_fig{7,8,9}.png`` from the CSVs that ``--write`` wrote (nothing recomputed), each
    stamped with the commit and command of ``beaumont_figures.json``."""
    made = json.loads((out / "beaumont_figures.json").read_text())
    stamp = f"data at commit {(made['git_commit'] or 'unknown')[:7]}: {made['command']}"
    plot7(pd.read_csv(out / "beaumont_fig7.csv"), out / "beaumont_fig7.png", stamp)
    plot8(pd.read_csv(out / "beaumont_fig8.csv"), out / "beaumont_fig8.png", stamp)
    plot9(pd.read_csv(out / "beaumont_fig9.csv"), out / "beaumont_fig9.png", stamp)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    what = ap.add_mutually_exclusive_group()
    what.add_argument("--write", action="store_true", help="write the CSVs, then the PNGs from them")
    what.add_argument("--render", action="store_true", help="only the PNGs, from the CSVs")
    ap.add_argument("--out", type=Path, default=OUT, help="folder for --write (default paper_figures/)")
    args = ap.parse_args(argv)
    if args.render:
        render(args.out)
        return
    df7, df8, df9 = figure7(), figure8(), figure9()
    with pd.option_context("display.width", 120, "display.precision", 3):
        print("Fig. 7 claim check (makespan ratio):")
        print(halving(df7).to_string(index=False))
        print("\nFig. 8 (makespan ratio at fixed slots) at the longest graphs:")
        print(df8[df8.L == max(FIG8_L)].to_string(index=False))
        print("\nFig. 9 (Equiv-Chain / optimal) at the longest graphs:")
        print(df9[df9.L >= max(FIG9_L) - 2].to_string(index=False))
    if args.write:
        args.out.mkdir(parents=True, exist_ok=True)
        df7.to_csv(args.out / "beaumont_fig7.csv", index=False, float_format="%.6g")
        df8.to_csv(args.out / "beaumont_fig8.csv", index=False, float_format="%.6g")
        df9.to_csv(args.out / "beaumont_fig9.csv", index=False, float_format="%.6g")
        (args.out / "beaumont_figures.json").write_text(json.dumps({"git_commit": git_commit(), "command": COMMAND}) + "\n")
        render(args.out)
        print(f"\nwrote {args.out}/beaumont_fig{{7,8,9}}.{{csv,png}} and beaumont_figures.json")


if __name__ == "__main__":
    main()
