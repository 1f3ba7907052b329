"""The paper-figures notebook runs headless on a small results fixture and writes the expected artefacts;
the largest-batch search finds the exact answer with few probes.

The fixture (tests/fixtures/paper_figures_results/) is a handful of real records copied from the store
that ``scripts/paper_figures.sh`` fills: ResNet-50's Table 1 row (6 methods, fake backend, DP memory
model ``liveness``), the search probes around its vanilla/ApproxDP-MC largest batch under 11.4 GiB,
PSPNet's vanilla probes (batch 2 fits, 3 does not) and PSPNet's CPU Figure 4 timings.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from experiments import figures
from experiments.max_batch import search

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "paper_figures_results"


@pytest.mark.parametrize(
    "peak, cap, start",
    [
        (lambda b: 1000 + 37 * b, 10_000, 96),        # affine (what the networks are): a few probes
        (lambda b: 1000 + 37 * b, 10_000, 1000),      # start far above the answer
        (lambda b: 50 + 3 * b + b * b // 40, 5_000, 2),  # convex: still exact
        (lambda b: 20_000 + b, 10_000, 8),             # parameters alone exceed the cap
    ],
)
def test_search_finds_the_largest_fitting_batch(peak, cap, start):
    res = search(peak, cap, start)
    truth = max([0] + [b for b in range(1, 5000) if peak(b) <= cap])
    assert res.max_batch == truth
    assert len(res.probes) <= 12
    if truth:  # both sides of the answer were probed: the store proves it
        assert res.probes[truth] <= cap < res.probes[truth + 1]


def test_search_stops_on_a_failed_probe():
    res = search(lambda b: None if b > 10 else b, 100, 8)
    assert res.max_batch is None and None in res.probes.values()


def test_notebook_writes_the_artefacts(tmp_path):
    records = sorted(FIXTURE.glob("*.json"))
    assert records, "fixture missing"
    out = tmp_path / "paper_figures"
    nb = figures.execute_notebook(
        ROOT / "notebooks" / "paper_figures.py", tmp_path / "paper_figures.ipynb", cwd=ROOT,
        env={"PAPER_FIGURES_RESULTS": str(FIXTURE), "PAPER_FIGURES_OUT": str(out)}, timeout=120,
    )
    assert not [o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    for name in ("table1.md", "table1.csv", "max_batch.md", "max_batch.csv", "figure4.png", "figure4.pdf"):
        assert (out / name).stat().st_size > 0, name

    t1 = pd.read_csv(out / "table1.csv")
    required = {"network", "method", "batch_size", "peak_gb", "reduction", "paper_peak_gb", "paper_reduction"}
    assert required <= set(t1.columns)
    assert len(t1) == 7 * 6 and not t1.duplicated(["network", "method"]).any()  # every paper cell, once
    r50 = t1[t1["network"] == "resnet50"].set_index("method")
    assert (r50["status"] == "ok").all() and (r50["batch_size"] == 96).all()
    assert r50.at["vanilla", "reduction"] == 0 and (r50.drop("vanilla")["reduction"] > 0.3).all()
    assert r50.at["approxdp_mc", "paper_peak_gb"] == 3.4
    # the fixture's only other paper-scale records are PSPNet's vanilla search probes (batch 2 and 3)
    others = t1[t1["network"] != "resnet50"]
    assert others[others["status"] != "missing"][["network", "method"]].values.tolist() == [["pspnet", "vanilla"]]
    assert "| resnet50 | 96 |" in (out / "table1.md").read_text()

    mb = pd.read_csv(out / "max_batch.csv")
    assert {"network", "method", "device_memory_gb", "max_batch"} <= set(mb.columns)
    mb = mb.set_index(["network", "method"])
    fixture = pd.DataFrame([json.loads(p.read_text()) for p in records])
    for method in ("vanilla", "approxdp_mc"):
        row = mb.loc[("resnet50", method)]
        assert row["proven"] and row["device_memory_gb"] == 11.4
        probes = fixture[(fixture["net"] == "resnet50") & (fixture["method"] == method) & (fixture["memory_backend"] == "fake")]
        fits = probes[probes["measured_peak_bytes"] <= 11.4 * 2**30]["batch_size"]
        assert row["max_batch"] == fits.max()
    assert mb.loc[("resnet50", "approxdp_mc"), "max_batch"] > mb.loc[("resnet50", "vanilla"), "max_batch"]
