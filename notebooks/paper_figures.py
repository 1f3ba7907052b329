# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Kusumoto et al. (2019): Table 1, Figure 4 and the largest batch, from the results store
#
# Regenerated end to end by `bash scripts/paper_figures.sh` (the sweeps, then this notebook headless).
# The notebook only *reads* records — from the local store (`results/`) or from W&B — and writes
# `paper_figures/table1.{md,csv}` (+ `table1_<other memory model>.*`), `paper_figures/differences.{md,csv}`,
# `paper_figures/max_batch.{md,csv}` and `paper_figures/figure4.{png,pdf}`.
# The computations live in `experiments/figures.py` and `experiments/max_batch.py`.
#
# Parameters come from the environment so that a headless run (the script, the test) can point
# the notebook elsewhere without editing it:
#
# | variable | default | meaning |
# |---|---|---|
# | `PAPER_FIGURES_RESULTS` | `results` | local results store |
# | `PAPER_FIGURES_SOURCE` | `local` | `local` or `wandb` |
# | `PAPER_FIGURES_WANDB_PROJECT` / `_ENTITY` | `recompute` / none | W&B run summaries to read instead |
# | `PAPER_FIGURES_OUT` | `paper_figures` | where the artefacts go |
# | `PAPER_FIGURES_DEVICE_GB` | `11.4` | device capacity (GiB) for the largest batch and Figure 4's vanilla cut |
# | `PAPER_FIGURES_TABLE1_BACKEND` | `fake` | memory backend of Table 1 (`cuda` on a GPU machine) |
# | `PAPER_FIGURES_TIME_BACKEND` | `cpu` | backend the Figure 4 runtimes were measured on |
# | `PAPER_FIGURES_FIG4_NOTE` | none | a line for Figure 4's title, e.g. how the timing machine was shared |
# | `PAPER_FIGURES_MEMORY_MODEL` | `liveness` | DP planners' memory model of the main artefacts (`paper` = eq. (2)) |

# %%
import os
from pathlib import Path

import pandas as pd
from IPython.display import Markdown, display

from experiments import figures, results

RESULTS = os.environ.get("PAPER_FIGURES_RESULTS", "results")
SOURCE = os.environ.get("PAPER_FIGURES_SOURCE", "local")
PROJECT = os.environ.get("PAPER_FIGURES_WANDB_PROJECT", "recompute")
OUT = Path(os.environ.get("PAPER_FIGURES_OUT", "paper_figures"))
DEVICE_GB = float(os.environ.get("PAPER_FIGURES_DEVICE_GB", "11.4"))
TABLE1_BACKEND = os.environ.get("PAPER_FIGURES_TABLE1_BACKEND", "fake")
TIME_BACKEND = os.environ.get("PAPER_FIGURES_TIME_BACKEND", "cpu")
MEMORY_MODEL = os.environ.get("PAPER_FIGURES_MEMORY_MODEL", "simulator")

# strict: an unreadable record stops here, naming its file, rather than leaving its cell of a table empty
df = results.load(RESULTS, source=SOURCE, project=PROJECT, entity=os.environ.get("PAPER_FIGURES_WANDB_ENTITY"), strict=True)
STORE = RESULTS if SOURCE == "local" else f"W&B project {PROJECT}"
figures.require_records(df, STORE)  # an empty store stops here, before any artefact is overwritten
OUT.mkdir(parents=True, exist_ok=True)
print(f"{len(df)} records from {STORE}")
df.groupby(["memory_backend", "status"]).size()

# %% [markdown]
# ## Table 1: peak memory at the paper's batch sizes
#
# Peak memory of one training step including the parameters (as in the paper), measured by
# `recompute.measure` on the memory backend at the paper's input size (PSPNet: 736², see
# `recompute.nets`); the reduction is relative to *our* vanilla run. "GB" is GiB (2³⁰ bytes).
# `predicted_over_measured` is the planner's predicted peak (+ parameters) over the measured one.
# The DP planners run with `MEMORY_MODEL` (`table1.*`); when the store also holds runs planned with
# the other model (the Table 1 preset sweeps both), they go to `table1_<model>.*` beside it.

# %%
def write_table1(memory_model: str, stem: str) -> pd.DataFrame:
    """Table 1 for one memory model as ``<stem>.csv`` (long form) and ``<stem>.md`` (the paper's layout)."""
    t = figures.write_table1(df, OUT, stem, backend=TABLE1_BACKEND, memory_model=memory_model)
    display(Markdown(f"**DP memory model `{memory_model}`**\n\n" + figures.table1_markdown(t)))
    return t


t1 = write_table1(MEMORY_MODEL, "table1")
planned = set(df["memory_model"].dropna()) if "memory_model" in df.columns else set()
others = {m: write_table1(m, f"table1_{m}") for m in sorted(planned - {MEMORY_MODEL})}

# %% [markdown]
# Where our reduction differs from the paper's by more than 10 points:

# %%
far = t1[t1["diff_points"].abs() > 10]
far[["network", "method", "peak_gb", "reduction", "paper_peak_gb", "paper_reduction", "diff_points", "predicted_over_measured"]]

# %% [markdown]
# Evidence for those networks (`differences.{md,csv}`): the traced graph at the paper's batch and size
# (#V, Σ M_v = every node output, which the paper's Chainer vanilla and eq. (2) keep; Σ saved = what
# PyTorch's autograd keeps; the largest single output) beside our and the paper's vanilla peak, and the
# best reduction under each DP memory model. Traced on fake tensors by the current code, not read
# from the store.

# %%
def differences(t: pd.DataFrame, by_model: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """One row per network with a >10-point difference: retention facts and best reductions."""
    rows = []
    for net in dict.fromkeys(t.loc[t["diff_points"].abs() > 10, "network"]):
        g = t[t["network"] == net].set_index("method")
        row = figures.retention(net)
        row.update(vanilla_gb=g.at["vanilla", "peak_gb"], paper_vanilla_gb=g.at["vanilla", "paper_peak_gb"],
                   best_reduction=g["reduction"].max(), paper_best_reduction=g["paper_reduction"].max(),
                   chen_reduction=g.at["chen", "reduction"], paper_chen_reduction=g.at["chen", "paper_reduction"])
        for model, other in by_model.items():
            row[f"best_dp_reduction_{model}"] = other[(other["network"] == net) & other["method"].str.contains("dp")]["reduction"].max()
        rows.append(row)
    return pd.DataFrame(rows)


diff = differences(t1, {MEMORY_MODEL: t1, **others})
diff.to_csv(OUT / "differences.csv", index=False, float_format="%.4f")
(OUT / "differences.md").write_text(figures.frame_markdown(diff) + "\n" if len(diff) else "no difference above 10 points\n")
diff

# %% [markdown]
# ## Largest batch under the device capacity
#
# Binary (secant) search over the batch size on the `fake` backend at the paper's input size
# (`python -m experiments.max_batch`); a batch fits when its measured peak incl. parameters is at most
# `DEVICE_GB` GiB. The paper reports PSPNet going from batch 2 (vanilla) to 8 (ApproxDP).

# %%
mb = figures.max_batch_table(df, DEVICE_GB, memory_model=MEMORY_MODEL)
mb.to_csv(OUT / "max_batch.csv", index=False, float_format="%.4f")
md = figures.max_batch_markdown(mb)
(OUT / "max_batch.md").write_text(md + "\n")
display(Markdown(md))

# %% [markdown]
# ## Figure 4: runtime vs batch size
#
# Forward+backward time per iteration over a batch grid, per method. Without a GPU the times come
# from the `cpu` backend at a reduced input size (named in each panel); vanilla stops at its largest
# batch under `DEVICE_GB` (from the table above, i.e. judged at the paper's input size) and is
# extrapolated linearly (dotted) beyond, as in the paper.

# %%
timings = figures.figure4_records(df, TIME_BACKEND, MEMORY_MODEL)
fig = figures.figure4(timings, mb, DEVICE_GB, TIME_BACKEND, note=os.environ.get("PAPER_FIGURES_FIG4_NOTE", ""))
for ext in ("png", "pdf"):
    fig.savefig(OUT / f"figure4.{ext}", dpi=150, bbox_inches="tight")
timings.pivot_table(index=["net", "batch_size"], columns="method", values="seconds")

# %%
print("wrote", sorted(p.name for p in OUT.iterdir() if p.stem.startswith(("table1", "max_batch", "figure4", "differences"))))
