"""Kusumoto et al. (2019) Table 1, Figure 4 and the largest-batch result from the results store.

Everything here is a pure function of a records DataFrame (:func:`experiments.results.load`, local
store or W&B) and the paper's numbers, so ``notebooks/paper_figures.py`` only wires them together:

    df = results.load("results")
    t1 = table1(df, paper_table1())                 # long form, one row per (network, method)
    mb = max_batch_table(df, device_memory_gb=11.4)
    fig = figure4(df, mb)

Records are shared between experiments (the store is keyed by config, not by sweep), so each
artefact *selects* the records it can use by what they measured, not by the sweep that wrote them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterable

import pandas as pd

from experiments import nets
from recompute.pricing.memory_model import MemoryModel
from recompute.planners.registry import methods, spec

from .config import GIB
from .max_batch import PAPER_DEVICE_GB, max_batch_from_records

__all__ = [
    "TABLE1_METHODS", "OURS_ONLY", "EXACT_OF", "MC_OF", "multi_recompute", "BEST_MULTI", "FIGURE4_METHODS", "METHOD_LABELS", "PAPER_TABLE1_CSV", "NoRecords", "require_records",
    "paper_table1_wide", "paper_table1", "paper_scale", "table1", "table1_markdown", "write_table1", "max_batch_table", "max_batch_markdown",
    "figure4_records", "figure4", "execute_notebook", "DP_METHODS", "MEMORY_MODELS", "FLAG_POINTS", "TABLE1_COLUMNS",
    "flagged", "provenance", "write_max_batch", "figure4_markdown",
]

TABLE1_METHODS = ["approxdp_mc", "approxdp_tc", "exactdp_mc", "exactdp_tc", "chen", "vanilla"]  # its column order
DP_METHODS = ("approxdp_mc", "approxdp_tc", "exactdp_mc", "exactdp_tc")  # the Table 1 methods with a memory model
EXACT_OF = {"approxdp_mc": "exactdp_mc", "approxdp_tc": "exactdp_tc"}  # Table 1's approximate DP columns → the exact one
MC_OF = {"approxdp_tc": "approxdp_mc", "exactdp_tc": "exactdp_mc"}  # its time-centric columns → the memory-centric one
MEMORY_MODELS = (MemoryModel.paper, MemoryModel.simulator)  # the paper's eq. (2) (reproduction), the exact simulated peak (ours)
FLAG_POINTS = 10.0  # a cell this many points of reduction from the paper's is explained (experiments.explain)
TABLE1_COLUMNS = ["network", "method", "memory_model", "batch_size", "status", "peak_gb", "reduction", "paper_peak_gb",
                  "paper_reduction", "diff_points", "num_nodes", "paper_num_nodes", "k", "solve_seconds",
                  "predicted_peak_gb", "predicted_over_measured", "recomputed_forwards", "backend", "planner", "slots",
                  "git_commit"]
BEST_MULTI = "multirecompute"  # Table 1's extra row per network: the smallest measured peak of a multi-recompute planner
OURS_ONLY = ["chen_greedy"]  # Table 1 columns the paper did not print: Chen et al.'s own budget search (their Alg. 3)
FIGURE4_METHODS = ["vanilla", "chen", "approxdp_tc", "approxdp_mc"]
METHOD_LABELS = {
    "approxdp_mc": "ApproxDP + MC", "approxdp_tc": "ApproxDP + TC", "exactdp_mc": "ExactDP + MC",
    "exactdp_tc": "ExactDP + TC", "chen": "Chen's", "vanilla": "Vanilla", BEST_MULTI: "Best multi-recompute",
    "chen_greedy": "Chen's budget search (Alg. 3)",
}
# Figure 4's colours: vanilla blue, ApproxDP+TC red, ApproxDP+MC orange, Chen green
COLORS = {"vanilla": "tab:blue", "approxdp_tc": "tab:red", "approxdp_mc": "tab:orange", "chen": "tab:green"}
PAPER_TABLE1_CSV = Path(__file__).resolve().parent / "reference" / "kusumoto2019_table1.csv"  # see its README


def multi_recompute(planner: Any) -> bool:
    """Whether a record's ``planner`` writes its own schedule, recomputing a value as often as it likes
    (not in the paper; the registry says which: ``emits_schedule``)."""
    return isinstance(planner, str) and planner in methods() and spec(planner).emits_schedule


class NoRecords(LookupError):
    """The results store holds no record: there is nothing to draw, and nothing is written."""


def require_records(df: pd.DataFrame, where: str) -> None:
    """Stop with a message that says what to run when ``df`` (the store ``where``) is empty."""
    if df.empty:
        raise NoRecords(
            f"no run records in {where}: nothing to draw, so no artefact was written or changed. Fill the store "
            "first (bash scripts/paper_figures.sh, or python run.py ... results_dir=<store>), or point "
            "PAPER_FIGURES_RESULTS at the store that holds them."
        )


def paper_table1_wide(path: str | Path = PAPER_TABLE1_CSV) -> pd.DataFrame:
    """The paper's Table 1 as typed in, one row per network (the index): ``batch``, ``num_nodes`` and
    ``<method>_gb`` per method."""
    return pd.read_csv(path, index_col="network")


def paper_table1(path: str | Path = PAPER_TABLE1_CSV) -> pd.DataFrame:
    """The paper's Table 1 in long form: network, method, paper_batch, paper_num_nodes, paper_peak_gb,
    paper_reduction (a fraction: the percentage the paper printed, not one recomputed from its rounded GB)."""
    wide = paper_table1_wide(path).reset_index()
    rows = []
    for r in wide.itertuples(index=False):
        for m in TABLE1_METHODS:
            printed = 0 if m == "vanilla" else getattr(r, f"{m}_pct")
            rows.append(dict(network=r.network, method=m, paper_batch=int(r.batch), paper_num_nodes=int(r.num_nodes),
                             paper_peak_gb=getattr(r, f"{m}_gb"), paper_reduction=-printed / 100))
    return pd.DataFrame(rows)


def _planned_with(df: pd.DataFrame, memory_model: str) -> pd.Series:
    """Rows planned with ``memory_model``; planners without one (vanilla, chen) record None and always match."""
    mm = df["memory_model"]
    return mm.isna() | (mm == memory_model)


def paper_scale(df: pd.DataFrame, backends: Iterable[str] = ("fake", "cuda"), memory_model: str = MemoryModel.simulator) -> pd.DataFrame:
    """Records measured at the paper's scale: a memory backend in ``backends``, the net's paper input
    size, the paper's cost model, the DP planners' ``memory_model``, the smallest feasible budget, no
    capacity cap, default seed.

    These are the only records whose peaks are comparable with Table 1 and with each other.
    """
    if df.empty:
        return df
    size = df["net"].map(lambda n: nets.spec(n).input_size[0] if n in nets.NETS else None)
    keep = (
        df["memory_backend"].isin(list(backends)) & (df["input_size"] == size) & (df["cost_model"] == "paper")
        & df["budget"].isna() & df["device_memory_bytes"].isna() & (df["seed"] == 0)
        & _planned_with(df, memory_model)
    )
    return df[keep]


def _table1_one(df: pd.DataFrame, paper: pd.DataFrame, backend: str, memory_model: str) -> pd.DataFrame:
    """Table 1 with the DP planners on one ``memory_model`` (see :func:`table1`)."""
    ours = paper_scale(df, (backend,), memory_model)
    if not ours.empty:
        ours = ours[ours["batch_size"] == ours["net"].map(lambda n: nets.spec(n).batch_size)]
        ours = ours.sort_values("timestamp").drop_duplicates(["net", "method"], keep="last")
        ours = ours.rename(columns={"net": "network"})
    cols = ["network", "method", "batch_size", "status", "measured_peak_bytes", "reduction", "num_nodes",
            "solve_seconds", "predicted_total_bytes", "overhead_fraction", "planner", "slots", "k", "git_commit"]
    ours = ours.reindex(columns=cols)
    multi = ours["planner"].map(multi_recompute).astype(bool)
    best = ours[multi & (ours["status"] == "ok")].sort_values("measured_peak_bytes").drop_duplicates("network")
    ours = pd.concat([ours[~multi], best.assign(method=BEST_MULTI)])
    firsts = paper.drop_duplicates("network")
    paper = pd.concat([paper, *(firsts.assign(method=m, paper_peak_gb=float("nan"), paper_reduction=float("nan"))
                                for m in [*OURS_ONLY, BEST_MULTI])])
    t = paper.merge(ours, on=["network", "method"], how="left")
    t["memory_model"] = t["method"].map(lambda m: memory_model if m in DP_METHODS else None)
    return t


def table1(df: pd.DataFrame, paper: pd.DataFrame, backend: str = "fake",
           memory_models: Iterable[str] = MEMORY_MODELS) -> pd.DataFrame:
    """Table 1 in long form: one row per (network, method, DP memory model) at the paper's batch, ours
    beside the paper's; the DP rows once per model in ``memory_models``, the others (vanilla, Chen, the
    best multi-recompute plan: planners without a memory model) once, with an empty ``memory_model``.

    Columns: network, method, memory_model, batch_size, status, peak_gb, reduction (fraction vs our
    vanilla), paper_peak_gb, paper_reduction (as printed), diff_points (ours − paper, percentage points of
    reduction), num_nodes, paper_num_nodes, k, solve_seconds, predicted_peak_gb, predicted_over_measured,
    recomputed_forwards (the plan's modelled recomputation, in forward passes: overhead ÷ T(V) under the
    paper's cost model), backend, planner, slots, git_commit (of the record). A cell without a record keeps
    its paper numbers and ``status`` = missing. The :data:`OURS_ONLY` rows carry no paper numbers; each
    network's :data:`BEST_MULTI` row (none either) is its successful record of a :func:`multi_recompute`
    planner with the smallest measured peak, ``planner`` and ``slots`` saying which.
    """
    models = list(memory_models)
    parts = [_table1_one(df, paper, backend, m) for m in models]
    t = pd.concat([parts[0], *(p[p["method"].isin(DP_METHODS)] for p in parts[1:])], ignore_index=True)
    t["status"] = t["status"].fillna("missing")
    t["batch_size"] = t["batch_size"].fillna(t["paper_batch"]).astype(int)
    t["peak_gb"] = t["measured_peak_bytes"] / GIB
    t["predicted_peak_gb"] = t["predicted_total_bytes"] / GIB
    t["predicted_over_measured"] = t["predicted_total_bytes"] / t["measured_peak_bytes"]
    t["recomputed_forwards"] = t["overhead_fraction"]
    t["diff_points"] = 100 * (t["reduction"] - t["paper_reduction"])
    t["backend"] = backend
    t["_model"] = pd.Categorical(t["memory_model"].fillna(""), ["", *models])
    t["network"] = pd.Categorical(t["network"], nets.names(paper_only=True))
    t["method"] = pd.Categorical(t["method"], [*TABLE1_METHODS, *OURS_ONLY, BEST_MULTI])
    t = t.sort_values(["network", "method", "_model"])
    return t[TABLE1_COLUMNS].astype({"network": str, "method": str}).reset_index(drop=True)


def flagged(t: pd.DataFrame, points: float = FLAG_POINTS) -> pd.DataFrame:
    """The cells of Table 1 whose reduction differs from the paper's printed one by more than ``points``."""
    return t[t["diff_points"].abs() > points]


def provenance(records: pd.DataFrame) -> str:
    """Which commits the records were made at (short hashes), for an artefact's header."""
    commits = sorted({c[:7] for c in records["git_commit"].dropna()})
    return f"records at commit {', '.join(commits)}" if commits else "no records"


def _gb(gb: float | None, red: float | None, forwards: float | None = None) -> str:
    """A Table 1 cell: GB, the reduction vs vanilla, and (ours) the forwards recomputed to get it."""
    if gb is None or pd.isna(gb):
        return "–"
    notes = [] if red is None or pd.isna(red) or abs(red) < 5e-4 else [f"{-100 * red:+.0f}%"]
    if forwards is not None and not pd.isna(forwards) and forwards > 0:
        notes.append(f"+{forwards:.2f} F")
    return f"{gb:.1f} GB" + (f" ({', '.join(notes)})" if notes else "")


def table1_markdown(t: pd.DataFrame) -> str:
    """The paper's layout (networks × methods), one row per network and DP memory model, each cell
    "ours / paper", ours with the forwards it recomputes (``+x F``); vanilla, Chen's, Chen's budget search
    and our best multi-recompute plan (planner, slot count c) use no memory model and repeat on both rows;
    then #V, batch and solve times."""
    lines = [
        "| Network | DP memory model | batch | #V ours / paper | " + " | ".join(METHOD_LABELS[m] for m in TABLE1_METHODS)
        + " | " + " | ".join(f"{METHOD_LABELS[m]} (ours)" for m in [*OURS_ONLY, BEST_MULTI])
        + " | solve s (ApproxDP MC / ExactDP MC) |",
        "|---|---|---|---|" + "---|" * (len(TABLE1_METHODS) + len(OURS_ONLY)) + "---|---|",
    ]
    for net, g in t.groupby("network", sort=False):
        shared = g[g["memory_model"].isna()].set_index("method")
        for model, dp in g.dropna(subset=["memory_model"]).groupby("memory_model", sort=False):
            cells_of = pd.concat([dp.set_index("method"), shared])

            def ours(m: str) -> str:
                return _gb(cells_of.at[m, "peak_gb"], cells_of.at[m, "reduction"], cells_of.at[m, "recomputed_forwards"])

            cells = [f"{ours(m)} / {_gb(cells_of.at[m, 'paper_peak_gb'], cells_of.at[m, 'paper_reduction'])}"
                     for m in TABLE1_METHODS]
            cells += [ours(m) for m in OURS_ONLY]
            multi = cells_of.loc[BEST_MULTI] if BEST_MULTI in cells_of.index else None
            found = multi is not None and not pd.isna(multi["peak_gb"])
            cells.append(f"{ours(BEST_MULTI)} ({multi['planner']}, c = {int(multi['slots'])})" if found else "–")
            nodes = cells_of["num_nodes"].dropna()
            solve = [cells_of.at[m, "solve_seconds"] for m in ("approxdp_mc", "exactdp_mc")]
            lines.append(
                f"| {net} | {model} | {int(cells_of['batch_size'].iloc[0])} | "
                f"{int(nodes.iloc[0]) if len(nodes) else '–'} / {int(cells_of['paper_num_nodes'].iloc[0])} | "
                + " | ".join(cells) + " | " + " / ".join("–" if pd.isna(x) else f"{x:.2f}" for x in solve) + " |"
            )
    return "\n".join(lines)


def write_table1(df: pd.DataFrame, out: str | Path, backend: str = "fake") -> pd.DataFrame:
    """Table 1 of the records ``df`` as ``<out>/table1.csv`` (long form) and ``table1.md`` (the paper's
    layout, titled with the records' commit and the commands); returns the long form."""
    t = table1(df, paper_table1(), backend=backend)
    out = Path(out)
    t.to_csv(out / "table1.csv", index=False, float_format="%.4f")
    (out / "table1.md").write_text(
        f"Table 1 — peak memory incl. parameters, ours ({backend} backend) / Kusumoto et al. (2019), "
        "the paper's percentages as printed; (−x%) = reduction vs vanilla; +x F = the forward passes our plan "
        "recomputes (its modelled overhead ÷ T(V), the paper's cost model). The DP planners with the paper's "
        "eq. (2) (`paper`) and with the exact simulated peak (`simulator`, the library's default). "
        f"{len(flagged(t))} cells differ from the paper by more than {FLAG_POINTS:g} points. "
        f"{provenance(t)} by `bash scripts/paper_figures.sh` (stage table1), rendered by "
        "`STAGES=notebook bash scripts/paper_figures.sh`.\n\n" + table1_markdown(t) + "\n"
    )
    return t


def _max_batch_records(df: pd.DataFrame, methods: Iterable[str], memory_model: str) -> pd.DataFrame:
    """The paper-scale fake records the largest-batch table is read from."""
    ours = paper_scale(df, ("fake",), memory_model)
    return ours[ours["method"].isin(list(methods))] if not ours.empty else ours


def max_batch_table(df: pd.DataFrame, device_memory_gb: float = PAPER_DEVICE_GB,
                    methods: Iterable[str] = FIGURE4_METHODS, memory_model: str = MemoryModel.simulator) -> pd.DataFrame:
    """Largest batch per (network, method) under ``device_memory_gb`` GiB, from paper-scale fake records
    (written by ``python -m experiments.max_batch``); ``proven`` is False where it is only a lower bound."""
    ours = _max_batch_records(df, methods, memory_model)
    if ours.empty:
        return pd.DataFrame(columns=["network", "method", "device_memory_gb", "max_batch", "paper_batch", "peak_gb", "probes", "proven"])
    mb = max_batch_from_records(ours, device_memory_gb).rename(columns={"net": "network"})
    mb["paper_batch"] = mb["network"].map(lambda n: nets.spec(n).batch_size)
    mb["network"] = pd.Categorical(mb["network"], nets.names(paper_only=True))
    mb["method"] = pd.Categorical(mb["method"], list(methods))
    cols = ["network", "method", "device_memory_gb", "max_batch", "paper_batch", "peak_gb", "probes", "proven"]
    return mb.sort_values(["network", "method"])[cols].astype({"network": str, "method": str}).reset_index(drop=True)


def max_batch_markdown(mb: pd.DataFrame, records: str = "") -> str:
    """Networks × methods; ``≥n`` marks a lower bound (the next batch was never probed); ``records`` (the
    :func:`provenance` of the probes) goes into the title."""
    methods = list(dict.fromkeys(mb["method"]))
    gb = mb["device_memory_gb"].iloc[0] if len(mb) else PAPER_DEVICE_GB
    lines = ["| Network (paper batch) | " + " | ".join(METHOD_LABELS.get(m, m) for m in methods) + " | best / vanilla |",
             "|---|" + "---|" * len(methods) + "---|"]
    for net, g in mb.groupby("network", sort=False):
        g = g.set_index("method")
        cell = lambda m: "–" if m not in g.index else f"{'' if g.at[m, 'proven'] else '≥'}{int(g.at[m, 'max_batch'])}"  # noqa: E731
        van = g.at["vanilla", "max_batch"] if "vanilla" in g.index else None
        ratio = f"{g['max_batch'].max() / van:.1f}×" if van else "–"
        lines.append(f"| {net} ({int(g['paper_batch'].iloc[0])}) | " + " | ".join(cell(m) for m in methods) + f" | {ratio} |")
    title = (f"Largest batch under {gb:g} GiB (fake backend, paper input size; the paper: PSPNet from 2 to 8). "
             f"{records} by `bash scripts/paper_figures.sh` (stage max_batch), rendered by "
             "`STAGES=notebook bash scripts/paper_figures.sh`.")
    return title + "\n\n" + "\n".join(lines)


def write_max_batch(df: pd.DataFrame, out: str | Path, device_memory_gb: float = PAPER_DEVICE_GB,
                    memory_model: str = MemoryModel.simulator) -> pd.DataFrame:
    """``<out>/max_batch.{csv,md}`` from the records ``df``; returns the table."""
    mb = max_batch_table(df, device_memory_gb, memory_model=memory_model)
    mb.to_csv(Path(out) / "max_batch.csv", index=False, float_format="%.4f")
    records = provenance(_max_batch_records(df, FIGURE4_METHODS, memory_model))
    (Path(out) / "max_batch.md").write_text(max_batch_markdown(mb, records) + "\n")
    return mb


def figure4_records(df: pd.DataFrame, backend: str = "cpu", memory_model: str = MemoryModel.simulator) -> pd.DataFrame:
    """Timings for Figure 4: one row per (net, method, batch) with every timed iteration (``samples``)
    and their ``n``, ``seconds`` (mean) and ``std``. Each run times vanilla beside its method, so
    vanilla's samples are those of every run at that point, pooled. A record of schema < 4 kept only
    its median, which then counts as one sample. If a net was timed at several input sizes, the
    most-timed size is kept. Columns: net, method, batch_size, time_input_size, n, seconds, std,
    samples, git_commit."""
    cols = ["net", "method", "batch_size", "time_input_size", "n", "seconds", "std", "samples", "git_commit"]
    if df.empty:
        return pd.DataFrame(columns=cols)
    t = df[(df["time_backend"] == backend) & (df["status"] == "ok") & df["seconds_per_iter"].notna()
           & _planned_with(df, memory_model)]
    t = t[t["time_batch_size"] == t["batch_size"]]  # batch on the x axis must be the timed batch
    if t.empty:
        return pd.DataFrame(columns=cols)
    size = t.groupby("net")["time_input_size"].agg(lambda s: s.value_counts().idxmax())
    t = t[t["time_input_size"] == t["net"].map(size)]
    t = t.sort_values("timestamp").drop_duplicates(["net", "method", "batch_size"], keep="last")
    samples = lambda times, median: list(times) if isinstance(times, list) and times else [median]  # noqa: E731
    rows = []
    for (net, batch), g in t.groupby(["net", "batch_size"], sort=True):
        pooled = [x for r in g.itertuples() for x in samples(r.vanilla_iteration_seconds, r.vanilla_seconds_per_iter)]
        for r in g.itertuples():
            xs = pooled if r.method == "vanilla" else samples(r.iteration_seconds, r.seconds_per_iter)
            s = pd.Series(xs, dtype=float)
            rows.append(dict(net=net, method=r.method, batch_size=int(batch), time_input_size=int(r.time_input_size),
                             n=len(xs), seconds=float(s.mean()), std=float(s.std()) if len(xs) > 1 else float("nan"),
                             samples=xs, git_commit=r.git_commit))
    return pd.DataFrame(rows, columns=cols).sort_values(["net", "method", "batch_size"]).reset_index(drop=True)


def figure4_markdown(timings: pd.DataFrame, backend: str) -> str:
    """Mean ± std per point, titled with the records' commit: a description, no test (the paired design's
    verdicts, :mod:`experiments.figure4_paired`, are Figure 4's claims)."""
    lines = ["| net | batch | input | " + " | ".join(f"{METHOD_LABELS[m]} s (mean ± std, n)" for m in FIGURE4_METHODS) + " |",
             "|---|---|---|" + "---|" * len(FIGURE4_METHODS)]
    for (net, batch), g in timings.groupby(["net", "batch_size"], sort=False):
        g = g.set_index("method")
        cell = lambda m: "–" if m not in g.index else f"{g.at[m, 'seconds']:.3f} ± {g.at[m, 'std']:.3f} ({g.at[m, 'n']})"  # noqa: E731
        lines.append(f"| {net} | {batch} | {int(g['time_input_size'].iloc[0])}² | " + " | ".join(cell(m) for m in FIGURE4_METHODS) + " |")
    return (f"Figure 4 timings on {backend} (seconds per forward+backward step), {provenance(timings)} by "
            "`bash scripts/paper_figures.sh` (stage figure4), rendered by `STAGES=notebook bash scripts/paper_figures.sh`. "
            "A description of each method's steps, not a comparison: five back-to-back steps are not independent "
            "samples and vanilla pools four runs, so no ordering is tested here; the paired design above makes "
            "Figure 4's claims.\n\n" + "\n".join(lines))


def _linear_fit(x: pd.Series, y: pd.Series) -> tuple[float, float]:
    """Least-squares line y = a + b·x; through the origin when there is a single point."""
    if len(x) == 1:
        return 0.0, float(y.iloc[0] / x.iloc[0])
    b = float(((x - x.mean()) * (y - y.mean())).sum() / ((x - x.mean()) ** 2).sum())
    return float(y.mean() - b * x.mean()), b


def figure4(timings: pd.DataFrame, max_batch: pd.DataFrame, device_memory_gb: float = PAPER_DEVICE_GB,
            backend: str = "cpu", note: str = "") -> Any:
    """Figure 4: runtime of one forward+backward step vs batch size, one panel per network.

    Vanilla is solid up to its largest batch under ``device_memory_gb`` (``max_batch``, judged on the
    fake backend at the paper's input size) and extrapolated linearly (dotted) beyond, as in the
    paper; the vanilla steps we *could* still time beyond it (a CPU has the memory) are drawn as hollow
    markers, so the extrapolation can be checked. ``note`` (e.g. how the machine was shared) is added
    to the title. Returns the matplotlib Figure.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    present = [n for n in nets.names(paper_only=True) if n in set(timings["net"])]
    ncols = min(4, max(1, len(present)))
    nrows = max(1, -(-len(present) // ncols))
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.2 * ncols, 3.6 * nrows + 0.9), squeeze=False)
    cut = {} if max_batch.empty else max_batch[max_batch["method"] == "vanilla"].set_index("network")["max_batch"].to_dict()
    for ax, net in zip(axes.flat, present):
        g = timings[timings["net"] == net]
        for method in FIGURE4_METHODS:
            m = g[g["method"] == method].sort_values("batch_size")
            if m.empty:
                continue
            style = dict(color=COLORS[method], marker="o", ms=4, capsize=2, label=METHOD_LABELS[method])
            if method != "vanilla" or net not in cut:
                ax.errorbar(m["batch_size"], m["seconds"], yerr=m["std"], **style)
                continue
            fits = m[m["batch_size"] <= cut[net]]
            beyond = m[m["batch_size"] > cut[net]]
            if not fits.empty:
                ax.errorbar(fits["batch_size"], fits["seconds"], yerr=fits["std"], **style)
                a, b = _linear_fit(fits["batch_size"], fits["seconds"])
                xs = pd.Series([fits["batch_size"].max(), g["batch_size"].max()])
                ax.plot(xs, a + b * xs, color=COLORS[method], ls=":", lw=1.5, label="Vanilla (extrapolated)")
            if not beyond.empty:
                ax.errorbar(beyond["batch_size"], beyond["seconds"], yerr=beyond["std"], ls="none", marker="o", mfc="none",
                            color=COLORS[method], ms=5, capsize=2, label="Vanilla (timed, would not fit)")
            ax.axvline(cut[net], color="0.6", lw=0.8, ls="--")
        size = int(g["time_input_size"].iloc[0])
        ax.set_title(f"{net} ({backend}, input {size}×{size}; vanilla max {cut.get(net, '?')})", fontsize=9)
        ax.set_xlabel("batch size")
        ax.set_ylabel("seconds / iteration (mean ± std)")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(present):]:
        ax.set_visible(False)
    if not present:
        fig.text(0.5, 0.5, f"no {backend} timings in the results store", ha="center", va="center")
    if present:
        handles, labels = axes.flat[0].get_legend_handles_labels()
        fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=8, frameon=False)
    fig.suptitle(
        f"Figure 4 (Kusumoto et al. 2019): runtime vs batch size — measured on {backend.upper()}"
        f"{' at a reduced input size' if backend == 'cpu' else ''};\n"
        f"vanilla's capacity ({device_memory_gb:g} GiB, dashed line) judged on the fake backend at the paper's input size; "
        f"{provenance(timings)}" + (f"\n{note}" if note else ""),
        fontsize=10,
    )
    fig.tight_layout(rect=(0, 0.06, 1, 0.91 if note else 0.93))
    return fig


def execute_notebook(source: str | Path, ipynb: str | Path | None = None, *, cwd: str | Path | None = None,
                     env: dict[str, str] | None = None, timeout: int = 600) -> Any:
    """Run a jupytext notebook headless (nbclient, this interpreter's ``python3`` kernel) and return it.

    ``env`` is added to the kernel's environment (the notebook reads its parameters from there);
    ``ipynb``, when given, receives the executed notebook with its outputs.
    """
    import jupytext
    from nbclient import NotebookClient

    nb = jupytext.read(source)
    old = {k: os.environ.get(k) for k in env or {}}
    os.environ.update(env or {})  # the kernel inherits this process's environment
    try:
        NotebookClient(nb, timeout=timeout, kernel_name="python3",
                       resources={"metadata": {"path": str(cwd or Path(source).resolve().parents[1])}}).execute()
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    if ipynb is not None:
        jupytext.write(nb, ipynb, fmt="ipynb")
    return nb

