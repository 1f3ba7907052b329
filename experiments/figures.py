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

from recompute import nets
from recompute.memory_model import PLANNING, MemoryModel

from .config import GIB
from .max_batch import PAPER_DEVICE_GB, max_batch_from_records

__all__ = [
    "TABLE1_METHODS", "MULTI_METHODS", "BEST_MULTI", "FIGURE4_METHODS", "METHOD_LABELS", "PAPER_TABLE1_CSV", "NoRecords", "require_records",
    "paper_table1_wide", "paper_table1", "paper_scale", "table1", "table1_markdown", "write_table1", "max_batch_table", "max_batch_markdown",
    "figure4_records", "figure4", "execute_notebook", "retention", "frame_markdown",
]

TABLE1_METHODS = ["approxdp_mc", "approxdp_tc", "exactdp_mc", "exactdp_tc", "chen", "vanilla"]  # its column order
MULTI_METHODS = ("revolve", "chen_recursive", "join_dp")  # planners that recompute more than once (not in the paper)
BEST_MULTI = "multirecompute"  # Table 1's extra row per network: the smallest measured peak of MULTI_METHODS
FIGURE4_METHODS = ["vanilla", "chen", "approxdp_tc", "approxdp_mc"]
METHOD_LABELS = {
    "approxdp_mc": "ApproxDP + MC", "approxdp_tc": "ApproxDP + TC", "exactdp_mc": "ExactDP + MC",
    "exactdp_tc": "ExactDP + TC", "chen": "Chen's", "vanilla": "Vanilla", BEST_MULTI: "Best multi-recompute",
}
# Figure 4's colours: vanilla blue, ApproxDP+TC red, ApproxDP+MC orange, Chen green
COLORS = {"vanilla": "tab:blue", "approxdp_tc": "tab:red", "approxdp_mc": "tab:orange", "chen": "tab:green"}
PAPER_TABLE1_CSV = Path(__file__).resolve().parent / "reference" / "kusumoto2019_table1.csv"  # see its README


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
    paper_reduction (a fraction, recomputed from the GB columns as the paper's percentages were)."""
    wide = paper_table1_wide(path).reset_index()
    rows = []
    for r in wide.itertuples(index=False):
        for m in TABLE1_METHODS:
            gb = getattr(r, f"{m}_gb")
            rows.append(dict(network=r.network, method=m, paper_batch=int(r.batch), paper_num_nodes=int(r.num_nodes),
                             paper_peak_gb=gb, paper_reduction=1 - gb / r.vanilla_gb))
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


def table1(df: pd.DataFrame, paper: pd.DataFrame, backend: str = "fake", memory_model: str = MemoryModel.simulator) -> pd.DataFrame:
    """Table 1 in long form: one row per (network, method) at the paper's batch, ours beside the paper's.

    Columns: network, method, batch_size, status, peak_gb, reduction (fraction vs our vanilla),
    paper_peak_gb, paper_reduction, diff_points (ours − paper, percentage points of reduction),
    num_nodes, paper_num_nodes, solve_seconds, predicted_peak_gb, predicted_over_measured, backend,
    memory_model (the DP planners'; vanilla and Chen do not use one), planner, slots.
    A (network, method) without a record keeps its paper numbers and ``status`` = missing. Each network
    also gets a :data:`BEST_MULTI` row (no paper numbers): its successful record of
    :data:`MULTI_METHODS` with the smallest measured peak, ``planner`` and ``slots`` saying which.
    """
    ours = paper_scale(df, (backend,), memory_model)
    if not ours.empty:
        ours = ours[ours["batch_size"] == ours["net"].map(lambda n: nets.spec(n).batch_size)]
        ours = ours.sort_values("timestamp").drop_duplicates(["net", "method"], keep="last")
        ours = ours.rename(columns={"net": "network"})
    cols = ["network", "method", "batch_size", "status", "measured_peak_bytes", "reduction", "num_nodes",
            "solve_seconds", "predicted_total_bytes", "planner", "slots"]
    ours = ours.reindex(columns=cols)
    multi = ours["method"].isin(MULTI_METHODS)
    best = ours[multi & (ours["status"] == "ok")].sort_values("measured_peak_bytes").drop_duplicates("network")
    ours = pd.concat([ours[~multi], best.assign(method=BEST_MULTI)])
    paper = pd.concat([paper, paper.drop_duplicates("network").assign(
        method=BEST_MULTI, paper_peak_gb=float("nan"), paper_reduction=float("nan"))])
    t = paper.merge(ours, on=["network", "method"], how="left")
    t["status"] = t["status"].fillna("missing")
    t["batch_size"] = t["batch_size"].fillna(t["paper_batch"]).astype(int)
    t["peak_gb"] = t["measured_peak_bytes"] / GIB
    t["predicted_peak_gb"] = t["predicted_total_bytes"] / GIB
    t["predicted_over_measured"] = t["predicted_total_bytes"] / t["measured_peak_bytes"]
    t["diff_points"] = 100 * (t["reduction"] - t["paper_reduction"])
    t["backend"] = backend
    t["memory_model"] = memory_model
    order = ["network", "method", "batch_size", "status", "peak_gb", "reduction", "paper_peak_gb", "paper_reduction",
             "diff_points", "num_nodes", "paper_num_nodes", "solve_seconds", "predicted_peak_gb",
             "predicted_over_measured", "backend", "memory_model", "planner", "slots"]
    t["network"] = pd.Categorical(t["network"], nets.names(paper_only=True))
    t["method"] = pd.Categorical(t["method"], [*TABLE1_METHODS, BEST_MULTI])
    return t.sort_values(["network", "method"])[order].astype({"network": str, "method": str}).reset_index(drop=True)


def _gb(gb: float | None, red: float | None) -> str:
    if gb is None or pd.isna(gb):
        return "–"
    return f"{gb:.1f} GB" if red is None or pd.isna(red) or abs(red) < 5e-4 else f"{gb:.1f} GB ({-100 * red:+.0f}%)"


def table1_markdown(t: pd.DataFrame) -> str:
    """The paper's layout (networks × methods), each cell "ours / paper", then our best multi-recompute
    plan (planner and slot count c), #V, batch and solve times."""
    lines = [
        "| Network | batch | #V ours / paper | " + " | ".join(METHOD_LABELS[m] for m in TABLE1_METHODS)
        + f" | {METHOD_LABELS[BEST_MULTI]} (ours) | solve s (ApproxDP MC / ExactDP MC) |",
        "|---|---|---|" + "---|" * len(TABLE1_METHODS) + "---|---|",
    ]
    for net, g in t.groupby("network", sort=False):
        g = g.set_index("method")
        cells = [f"{_gb(g.at[m, 'peak_gb'], g.at[m, 'reduction'])} / {_gb(g.at[m, 'paper_peak_gb'], g.at[m, 'paper_reduction'])}"
                 for m in TABLE1_METHODS]
        multi = g.loc[BEST_MULTI] if BEST_MULTI in g.index else None
        found = multi is not None and not pd.isna(multi["peak_gb"])
        cells.append(f"{_gb(multi['peak_gb'], multi['reduction'])} ({multi['planner']}, c = {int(multi['slots'])})"
                     if found else "–")
        nodes = g["num_nodes"].dropna()
        solve = [g.at[m, "solve_seconds"] for m in ("approxdp_mc", "exactdp_mc")]
        lines.append(
            f"| {net} | {int(g['batch_size'].iloc[0])} | {int(nodes.iloc[0]) if len(nodes) else '–'} / {int(g['paper_num_nodes'].iloc[0])} | "
            + " | ".join(cells) + " | " + " / ".join("–" if pd.isna(s) else f"{s:.2f}" for s in solve) + " |"
        )
    return "\n".join(lines)


def write_table1(df: pd.DataFrame, out: str | Path, stem: str = "table1", backend: str = "fake",
                 memory_model: str = MemoryModel.simulator) -> pd.DataFrame:
    """Table 1 of the records ``df`` as ``<out>/<stem>.csv`` (long form) and ``<stem>.md`` (the paper's
    layout, titled); returns the long form. Only Table 1 is written, so ``python -m experiments.figures``
    refreshes it from a store that holds the Table 1 sweep and nothing else."""
    t = table1(df, paper_table1(), backend=backend, memory_model=memory_model)
    out = Path(out)
    t.to_csv(out / f"{stem}.csv", index=False, float_format="%.4f")
    (out / f"{stem}.md").write_text(
        f"Table 1 — peak memory incl. parameters, ours ({backend} backend, DP memory model `{memory_model}`) / "
        "Kusumoto et al. (2019); (−x%) = reduction vs vanilla\n\n" + table1_markdown(t) + "\n"
    )
    return t


def max_batch_table(df: pd.DataFrame, device_memory_gb: float = PAPER_DEVICE_GB,
                    methods: Iterable[str] = FIGURE4_METHODS, memory_model: str = MemoryModel.simulator) -> pd.DataFrame:
    """Largest batch per (network, method) under ``device_memory_gb`` GiB, from paper-scale fake records
    (written by ``python -m experiments.max_batch``); ``proven`` is False where it is only a lower bound."""
    ours = paper_scale(df, ("fake",), memory_model)
    ours = ours[ours["method"].isin(list(methods))] if not ours.empty else ours
    if ours.empty:
        return pd.DataFrame(columns=["network", "method", "device_memory_gb", "max_batch", "paper_batch", "peak_gb", "probes", "proven"])
    mb = max_batch_from_records(ours, device_memory_gb).rename(columns={"net": "network"})
    mb["paper_batch"] = mb["network"].map(lambda n: nets.spec(n).batch_size)
    mb["network"] = pd.Categorical(mb["network"], nets.names(paper_only=True))
    mb["method"] = pd.Categorical(mb["method"], list(methods))
    cols = ["network", "method", "device_memory_gb", "max_batch", "paper_batch", "peak_gb", "probes", "proven"]
    return mb.sort_values(["network", "method"])[cols].astype({"network": str, "method": str}).reset_index(drop=True)


def max_batch_markdown(mb: pd.DataFrame) -> str:
    """Networks × methods; ``≥n`` marks a lower bound (the next batch was never probed)."""
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
    return f"Largest batch under {gb:g} GiB (fake backend, paper input size)\n\n" + "\n".join(lines)


def figure4_records(df: pd.DataFrame, backend: str = "cpu", memory_model: str = MemoryModel.simulator) -> pd.DataFrame:
    """Timed records for Figure 4: one row per (net, method, batch) with ``seconds`` and, per
    (net, batch), ``vanilla_seconds`` = the median of every vanilla timing at that point (each run
    times vanilla beside its method, so there are several). If a net was timed at several input
    sizes, the most-timed size is kept. Columns: net, method, batch_size, time_input_size, seconds,
    vanilla_seconds."""
    cols = ["net", "method", "batch_size", "time_input_size", "seconds", "vanilla_seconds"]
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
    van = t.groupby(["net", "batch_size"])["vanilla_seconds_per_iter"].median().rename("vanilla_seconds")
    t = t.rename(columns={"seconds_per_iter": "seconds"}).join(van, on=["net", "batch_size"])
    t.loc[t["method"] == "vanilla", "seconds"] = t["vanilla_seconds"]
    return t[cols].sort_values(["net", "method", "batch_size"]).reset_index(drop=True)


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
            style = dict(color=COLORS[method], marker="o", ms=4, label=METHOD_LABELS[method])
            if method != "vanilla" or net not in cut:
                ax.plot(m["batch_size"], m["seconds"], **style)
                continue
            fits = m[m["batch_size"] <= cut[net]]
            beyond = m[m["batch_size"] > cut[net]]
            if not fits.empty:
                ax.plot(fits["batch_size"], fits["seconds"], **style)
                a, b = _linear_fit(fits["batch_size"], fits["seconds"])
                xs = pd.Series([fits["batch_size"].max(), g["batch_size"].max()])
                ax.plot(xs, a + b * xs, color=COLORS[method], ls=":", lw=1.5, label="Vanilla (extrapolated)")
            if not beyond.empty:
                ax.plot(beyond["batch_size"], beyond["seconds"], ls="none", marker="o", mfc="none",
                        color=COLORS[method], ms=5, label="Vanilla (timed, would not fit)")
            ax.axvline(cut[net], color="0.6", lw=0.8, ls="--")
        size = int(g["time_input_size"].iloc[0])
        ax.set_title(f"{net} ({backend}, input {size}×{size}; vanilla max {cut.get(net, '?')})", fontsize=9)
        ax.set_xlabel("batch size")
        ax.set_ylabel("seconds / iteration (fwd+bwd)")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(present):]:
        ax.set_visible(False)
    if not present:
        fig.text(0.5, 0.5, f"no {backend} timings in the results store", ha="center", va="center")
    if present:
        handles, labels = axes.flat[0].get_legend_handles_labels()
        fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=8, frameon=False)
    fig.suptitle(
        f"Figure 4 (Kusumoto et al. 2019): runtime vs batch size — measured on {backend.upper()} at a reduced input size;\n"
        f"vanilla's capacity ({device_memory_gb:g} GiB, dashed line) judged on the fake backend at the paper's input size"
        + (f"\n{note}" if note else ""),
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


def retention(net: str, batch_size: int | None = None) -> dict[str, Any]:
    """What a framework *could* keep for backward vs what PyTorch's autograd keeps, for one network at
    its paper batch and size (traced on fake tensors, nothing allocated).

    The paper's vanilla (Chainer) keeps every node's output until its backward; eq. (2) charges the
    same M_v. PyTorch keeps only ``saved`` bytes (in-place ReLU overwrites the conv output, an add's
    inputs are not saved, ...). Where Σ saved is far below Σ M_v, vanilla is already lean and
    recomputation has less to remove, which is the first suspect for a reduction below the paper's.
    Returns net, num_nodes, param_gb, all_outputs_gb (Σ M_v), saved_gb (Σ saved), saved_fraction,
    largest_output_gb (max M_v: any strategy must hold it and its gradient at some point),
    chen_split_candidates (nodes every input-to-output path passes through: the only places Chen's
    segmentation can cut, so few candidates mean few, large segments).
    """
    import recompute
    from recompute.planners.chen import split_candidates

    spec = nets.spec(net)
    model, inputs = nets.build(net, batch_size=batch_size or spec.batch_size, fake_inputs=True)
    g = recompute.trace(model, inputs)
    params = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
    return dict(net=net, num_nodes=g.n, param_gb=params / GIB, all_outputs_gb=int(g.mem.sum()) / GIB,
                saved_gb=int(g.saved.sum()) / GIB, saved_fraction=float(g.saved.sum() / g.mem.sum()),
                largest_output_gb=int(g.mem.max()) / GIB, chen_split_candidates=len(split_candidates(g)))


def frame_markdown(df: pd.DataFrame, floatfmt: str = ".2f") -> str:
    """A DataFrame as a GitHub markdown table (pandas' ``to_markdown`` needs tabulate, not a dependency)."""
    cell = lambda v: "–" if v is None or (isinstance(v, float) and pd.isna(v)) else (format(v, floatfmt) if isinstance(v, float) else str(v))  # noqa: E731
    lines = ["| " + " | ".join(map(str, df.columns)) + " |", "|" + "---|" * len(df.columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join(lines)


def main() -> None:
    """``python -m experiments.figures``: Table 1 only, from a local store (the notebook writes everything)."""
    import argparse

    from . import results

    parser = argparse.ArgumentParser(description="write <out>/table1.{md,csv} from the run records of a local store")
    parser.add_argument("--results", default="results", help="the local results store")
    parser.add_argument("--out", default="paper_figures")
    parser.add_argument("--stem", default="table1", help="file name without extension")
    parser.add_argument("--memory-model", default=MemoryModel.simulator, choices=PLANNING, type=MemoryModel)
    args = parser.parse_args()
    df = results.load(args.results)
    require_records(df, args.results)
    write_table1(df, args.out, args.stem, memory_model=args.memory_model)


if __name__ == "__main__":
    main()
