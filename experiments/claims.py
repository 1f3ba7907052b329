"""Kusumoto et al. (2019)'s claims about Table 1 and the largest batch (§5), each checked on our records.

The paper states more than its tables: how fast its DPs solve, which networks its method beats Chen's
on, how much it saves, how far PSPNet's batch grows. Each :class:`Claim` quotes the sentence, states what
our Table 1 (:func:`experiments.figures.table1`) and largest-batch table
(:func:`experiments.figures.max_batch_table`) say, and whether the claim holds here, so that no such
sentence is typed by hand:

    markdown(claims(t1, mb))
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from .figures import METHOD_LABELS

__all__ = ["Claim", "claims", "markdown"]


@dataclass(frozen=True)
class Claim:
    """A sentence of the paper, what our records say about it, and whether it holds here."""

    paper: str
    ours: str
    holds: str  # "holds", "does not hold" or "holds in part"


def _rows(t1: pd.DataFrame, methods: tuple[str, ...]) -> pd.DataFrame:
    return t1[t1["method"].isin(methods) & t1["status"].eq("ok")]


def _solve(t1: pd.DataFrame) -> list[Claim]:
    out = []
    approx = _rows(t1, ("approxdp_mc", "approxdp_tc")).dropna(subset=["solve_seconds"])
    if len(approx):
        slowest = approx.loc[approx["solve_seconds"].idxmax()]
        over = sorted(set(approx[approx["solve_seconds"] > 1]["network"]))
        out.append(Claim(
            "\"the approximate DP completed within 1 sec for all networks\"",
            f"slowest: {slowest['network']} {METHOD_LABELS[slowest['method']]} (`{slowest['memory_model']}`) "
            f"{slowest['solve_seconds']:.2f} s" + (f"; over 1 s on {', '.join(over)}" if over else ""),
            "does not hold" if over else "holds"))
    exact = _rows(t1, ("exactdp_mc", "exactdp_tc")).dropna(subset=["solve_seconds"])
    named = exact[exact["network"].isin(["googlenet", "pspnet"])]
    if len(named):
        longest = named.loc[named["solve_seconds"].idxmax()]
        out.append(Claim(
            "\"the exact DP algorithm required more than 80 secs to complete for GoogLeNet and PSPNet\"",
            f"at most {longest['solve_seconds']:.2f} s ({longest['network']}, {METHOD_LABELS[longest['method']]}, "
            f"`{longest['memory_model']}`): our exact DP enumerates the same lower sets in compiled code",
            "holds" if longest["solve_seconds"] > 80 else "does not hold"))
    return out


def _beats_chen(t1: pd.DataFrame) -> list[Claim]:
    out = []
    for model, dp in _rows(t1, ("approxdp_mc",)).groupby("memory_model", sort=False):
        chen = _rows(t1, ("chen",)).set_index("network")["peak_gb"]
        mc = dp.set_index("network")["peak_gb"]
        mc = mc[mc.index.isin(chen.index)]  # the networks with both records
        if mc.empty:
            continue
        lose = [f"{n} ({mc[n]:.2f} against Chen's {chen[n]:.2f} GB)" for n in mc.index if mc[n] >= chen[n]]
        out.append(Claim(
            "\"our method outperforms the previous method in terms of the peak memory consumption\" "
            f"(ApproxDP + MC against Chen's, DP on `{model}`)",
            f"lower than Chen's on {len(mc) - len(lose)} of {len(mc)} networks" + (f"; not on {', '.join(lose)}" if lose else ""),
            "holds in part" if lose else "holds"))
    return out


def _savings(t1: pd.DataFrame) -> list[Claim]:
    mc = _rows(t1, ("approxdp_mc",))
    if mc.empty:
        return []
    cells, met = [], []
    for net, printed in (("densenet161", 81), ("pspnet", 71)):
        for _, r in mc[mc["network"] == net].iterrows():
            cells.append(f"{net} {-100 * r['reduction']:+.0f}% (`{r['memory_model']}`)")
            met.append(round(100 * r["reduction"]) >= printed)
    holds = "holds" if met and all(met) else "holds in part" if any(met) else "does not hold"
    return [Claim("\"In DenseNet and PSPNet, we are succeeding in reducing the memory consumption respectively by 81% "
                  "and 71%\" (ApproxDP + MC)", ", ".join(cells), holds)]


def _pspnet_batch(mb: pd.DataFrame) -> list[Claim]:
    rows = mb[mb["network"] == "pspnet"].set_index("method")["max_batch"]
    if "vanilla" not in rows or "approxdp_mc" not in rows:
        return []
    best = max(rows.get("approxdp_mc", 0), rows.get("approxdp_tc", 0))
    return [Claim("\"For PSPNet, our method was able to increase the maximum possible batch size from 2 to 8\"",
                  f"from {int(rows['vanilla'])} to {int(best)} under the same capacity (Chen's: {int(rows.get('chen', 0))})",
                  "holds" if rows["vanilla"] == 2 and best >= 8 else "does not hold")]


def claims(t1: pd.DataFrame, mb: pd.DataFrame) -> list[Claim]:
    """Every checked claim of §5 that the records reach, from Table 1's long form ``t1`` and the
    largest-batch table ``mb`` (a claim without the records it needs is left out)."""
    return [*_solve(t1), *_beats_chen(t1), *_savings(t1), *_pspnet_batch(mb)]


def markdown(found: list[Claim]) -> str:
    """A table: the paper's sentence, ours, whether it holds."""
    if not found:
        return "No record of Table 1 or the largest batch reaches a claim of the paper."
    lines = ["| the paper (§5) | ours | |", "|---|---|---|"]
    lines += [f"| {c.paper} | {c.ours} | {c.holds} |" for c in found]
    return "\n".join(lines)
