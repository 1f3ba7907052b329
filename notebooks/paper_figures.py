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
# # Every paper artefact, rendered from the stored records
#
# The notebook stage of `bash scripts/paper_figures.sh` (`STAGES=notebook` alone re-renders everything from the
# records shipped in `paper_figures/records/` and the stages' JSON, nothing measured). It only *reads*: the
# results store (local, or W&B) and `paper_figures/{chen2016_depth,feng2018_table1}.json`,
# `beaumont_fig{7,8,9}.csv`, `beaumont_figures.json`; it writes every artefact of `paper_figures/` and rewrites the tables included in
# `README.md` and `paper_figures/README.md` (`experiments.docs`). The computations live in `experiments/render.py`.
#
# Parameters come from the environment, so that a headless run (the script, the tests) can point it elsewhere:
#
# | variable | default | meaning |
# |---|---|---|
# | `PAPER_FIGURES_RESULTS` | `paper_figures/records` | local results store |
# | `PAPER_FIGURES_SOURCE` | `local` | `local` or `wandb` |
# | `PAPER_FIGURES_WANDB_PROJECT` / `_ENTITY` | `recompute` / none | W&B run summaries to read instead |
# | `PAPER_FIGURES_OUT` | `paper_figures` | where the artefacts go (the docs are rewritten only when it is `paper_figures`) |
# | `PAPER_FIGURES_DEVICE_GB` | `11.4` | device capacity (GiB) for the largest batch and Figure 4's vanilla cut |
# | `PAPER_FIGURES_TIME_BACKEND` | `cpu` | device the Figure 4 runtimes were measured on (`cuda` with `DEVICE=cuda`) |

# %%
import os
from pathlib import Path

from IPython.display import Markdown, display

from experiments import docs, figures, render, results

RESULTS = os.environ.get("PAPER_FIGURES_RESULTS", "paper_figures/records")
SOURCE = os.environ.get("PAPER_FIGURES_SOURCE", "local")
PROJECT = os.environ.get("PAPER_FIGURES_WANDB_PROJECT", "recompute")
OUT = Path(os.environ.get("PAPER_FIGURES_OUT", "paper_figures"))
DEVICE_GB = float(os.environ.get("PAPER_FIGURES_DEVICE_GB", "11.4"))
TIME_BACKEND = os.environ.get("PAPER_FIGURES_TIME_BACKEND", "cpu")

# strict: an unreadable record stops here, naming its file, rather than leaving its cell of a table empty
df = results.load(RESULTS, source=SOURCE, project=PROJECT, entity=os.environ.get("PAPER_FIGURES_WANDB_ENTITY"), strict=True)
STORE = RESULTS if SOURCE == "local" else f"W&B project {PROJECT}"
figures.require_records(df, STORE)  # an empty store stops here, before any artefact is overwritten
print(f"{len(df)} records from {STORE}")
df.groupby(["memory_backend", "status"]).size()

# %% [markdown]
# ## Table 1, its differences from the paper, the largest batch, Figure 4's timings

# %%
r = render.tables(df, OUT, DEVICE_GB, TIME_BACKEND)
for name in ("table1.md", "differences.md", "claims.md", "max_batch.md", "figure4.md"):
    display(Markdown((OUT / name).read_text()))

# %% [markdown]
# ## Figure 4: runtime vs batch size (mean ± std of the timed iterations)

# %%
render.figure4_plot(r, OUT, DEVICE_GB, TIME_BACKEND)
display(Markdown(f"![Figure 4]({OUT / 'figure4.png'})"))

# %% [markdown]
# ## Chen et al. (2016) depth sweep, Feng & Huang (2018) Table 1, Beaumont et al. (2020) Fig. 7 and 9

# %%
missing = render.from_json(Path("paper_figures"), OUT)
if missing:
    print("not rendered, their stage has not been run:", ", ".join(missing))

# %% [markdown]
# ## The docs' included tables

# %%
if OUT.resolve() == (docs.ROOT / "paper_figures").resolve():
    print("rewrote:", docs.update() or "nothing (already current)")
