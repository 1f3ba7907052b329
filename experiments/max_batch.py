"""The largest batch that fits a device of ``device_memory_gb`` GiB, per network and method.

Peak memory is measured on the ``fake`` backend at the paper's input size (no activation is
allocated), so a K40c-sized question (11.4 GB, Kusumoto et al. §5) is answered on any machine.
Every probe is an ordinary run of the experiment app (:func:`experiments.runner.run`), i.e. a
record in the results store with *no* ``device_memory_gb`` in its config: the cap is applied here,
not in the record, so one probe serves any capacity, probes at the Table 1 and Figure 4 batches are
shared with those sweeps, and a restarted search costs nothing. The largest batch is later read back
from the store by :func:`max_batch_from_records` (the notebook does that), with no state kept here.

    python -m experiments.max_batch --device-memory-gb 11.4 --jobs 2

The search assumes peak(b) is non-decreasing in b and uses that it is nearly affine
(parameters + b × activations): a secant guess from the probes so far, clamped into the open
bracket, lands next to the answer, and its neighbour proves it (about three probes); when the
neighbour does not close the bracket a bisection follows, so a peak far from affine still converges
in O(log b) probes.
"""

from __future__ import annotations

import argparse
import logging
import math
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pandas as pd

from .config import GIB
from .record import RunRecord, Status

__all__ = ["SearchResult", "search", "probe", "search_net_method", "max_batch_from_records", "PAPER_DEVICE_GB"]

log = logging.getLogger(__name__)

PAPER_DEVICE_GB = 11.4  # NVIDIA Tesla K40c of Kusumoto et al. §5 (the paper's "GB"; we use GiB throughout)
_CONF = Path(__file__).resolve().parents[1] / "conf"
_MAX_JUMP = 16  # unbracketed, never guess beyond this multiple of the largest fitting batch


@dataclass
class SearchResult:
    """Outcome of one search: ``max_batch`` (0: not even batch 1 fits, None: a probe failed)."""

    max_batch: int | None
    probes: dict[int, int | None] = field(default_factory=dict)  # batch -> total peak bytes (None: failed)


def _secant_guess(points: dict[int, int], lo: int, hi: int | None, cap: int) -> int:
    """The batch where the line through two probes reaches ``cap`` (through the origin with one)."""
    if lo and hi is not None:
        (b0, p0), (b1, p1) = (lo, points[lo]), (hi, points[hi])
    elif len(points) >= 2:
        (b0, p0), (b1, p1) = sorted(points.items())[-2:]
    else:
        (b0, p0), (b1, p1) = (0, 0), next(iter(points.items()))
    slope = (p1 - p0) / (b1 - b0) if b1 != b0 else 0
    if slope <= 0:  # flat or noisy: no information, double instead
        return 2 * max(lo, 1)
    return math.floor(b0 + (cap - p0) / slope)


def search(peak: Callable[[int], int | None], cap: int, start: int, max_probes: int = 32) -> SearchResult:
    """Largest b ≥ 1 with ``peak(b) <= cap``, starting at ``start``; ``peak`` returns None on failure.

    Invariant: every b ≤ ``lo`` fits (by monotonicity) and ``hi`` (once known) does not; the search
    ends when ``hi == lo + 1``, so the two probes that prove the answer are both in ``probes``.
    """
    res = SearchResult(max_batch=None)
    points: dict[int, int] = {}
    lo, hi = 0, None
    b, step = max(1, start), "start"  # the start is no guess: no neighbour to check
    while len(res.probes) < max_probes:
        p = peak(b)
        res.probes[b] = p
        if p is None:
            return res
        points[b] = p
        if p <= cap:
            lo = max(lo, b)
        else:
            hi = b if hi is None else min(hi, b)
        if hi is not None and hi - lo <= 1:
            res.max_batch = lo
            return res
        if hi is not None and step == "secant":
            # an affine peak puts the answer right next to a secant guess: check that neighbour first
            b, step = (lo + 1, "confirm") if p <= cap else (hi - 1, "confirm")
        elif hi is not None and step == "confirm":
            b, step = (lo + hi) // 2, "bisect"  # the guess was off: halve the bracket before trusting it again
        else:
            upper = hi - 1 if hi is not None else _MAX_JUMP * max(lo, 1)
            b, step = min(max(_secant_guess(points, lo, hi, cap), lo + 1), upper), "secant"
    log.warning("no answer after %d probes (lo=%s, hi=%s)", max_probes, lo, hi)
    return res


def _compose(overrides: list[str]) -> Any:
    """The app config for ``overrides`` (Hydra compose API: no Hydra runtime, so paths are explicit)."""
    from hydra import compose, initialize_config_dir

    from .config import to_experiment

    with initialize_config_dir(config_dir=str(_CONF), version_base="1.3"):
        return to_experiment(compose("config", overrides=overrides), overrides)


def probe(net: str, method: str, batch: int, results_dir: str | Path, extra: tuple[str, ...] = ()) -> RunRecord:
    """The record of ``net × method`` at ``batch`` on ``fake`` (run unless stored). Never raises."""
    from . import runner

    results_dir = Path(results_dir).resolve()
    exp = _compose([
        f"net={net}", f"method={method}", f"batch_size={batch}", "device=fake", "logger=none",
        "logger.group=max_batch", f"logger.dir={results_dir}", f"results_dir={results_dir}", *extra,
    ])
    record, _ = runner.run(exp, name=f"{net}-{method}-b{batch}", group="max_batch", wandb_config={})
    return record


def search_net_method(
    net: str, method: str, device_memory_gb: float, results_dir: str | Path, extra: tuple[str, ...] = ()
) -> SearchResult:
    """Search one (net, method), starting at the net's paper batch (its Table 1 record is reused)."""
    from experiments import nets

    def peak(b: int) -> int | None:
        rec = probe(net, method, b, results_dir, extra)
        return rec.measured_peak_bytes if rec.status == Status.ok else None

    res = search(peak, int(device_memory_gb * GIB), nets.spec(net).batch_size)
    log.info("%s × %s: max batch %s under %.1f GiB (probes %s)", net, method, res.max_batch, device_memory_gb, res.probes)
    return res


def max_batch_from_records(df: pd.DataFrame, device_memory_gb: float) -> pd.DataFrame:
    """Largest fitting batch per (net, method) from stored ``fake`` records, with its proof.

    ``df`` must already hold only comparable records (one net's paper input size, fake backend, …).
    A batch fits when ``measured_peak_bytes <= device_memory_gb`` GiB. ``proven`` says whether the
    next batch was probed and did not fit; otherwise ``max_batch`` is only a lower bound.
    Columns: net, method, device_memory_gb, max_batch, peak_gb (at max_batch), probes, proven.
    """
    cap = device_memory_gb * GIB
    rows = []
    for (net, method), g in df.groupby(["net", "method"], sort=False):
        ok = g[g["status"] == "ok"]
        fit = ok[ok["measured_peak_bytes"] <= cap]
        best = int(fit["batch_size"].max()) if not fit.empty else 0
        above = ok[ok["measured_peak_bytes"] > cap]
        rows.append(dict(
            net=net, method=method, device_memory_gb=device_memory_gb, max_batch=best,
            peak_gb=float(fit.loc[fit["batch_size"] == best, "measured_peak_bytes"].iloc[0] / GIB) if best else None,
            probes=len(g), proven=bool((above["batch_size"] == best + 1).any()),
        ))
    return pd.DataFrame(rows, columns=["net", "method", "device_memory_gb", "max_batch", "peak_gb", "probes", "proven"])


def _search_job(args: tuple[str, str, float, str, tuple[str, ...]]) -> tuple[str, str, int | None]:
    net, method, gb, results_dir, extra = args
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s][%(name)s][%(levelname)s] - %(message)s")
    return net, method, search_net_method(net, method, gb, results_dir, extra).max_batch


def _main() -> None:
    from experiments import nets

    parser = argparse.ArgumentParser(description="Largest batch under a device capacity (fake backend, paper input size).")
    parser.add_argument("--nets", nargs="+", default=nets.names(paper_only=True))
    parser.add_argument("--methods", nargs="+", default=["vanilla", "chen", "approxdp_tc", "approxdp_mc"])
    parser.add_argument("--device-memory-gb", type=float, default=PAPER_DEVICE_GB)
    parser.add_argument("--results-dir", default="results")
    parser.add_argument("--jobs", type=int, default=1, help="searches in parallel (processes)")
    parser.add_argument("overrides", nargs="*", help="extra Hydra overrides for every probe, e.g. cost_model=flops")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s][%(name)s][%(levelname)s] - %(message)s")
    jobs = [(n, m, args.device_memory_gb, args.results_dir, tuple(args.overrides)) for n in args.nets for m in args.methods]
    if args.jobs > 1:
        with ProcessPoolExecutor(args.jobs) as pool:
            found = list(pool.map(_search_job, jobs))
    else:
        found = [_search_job(j) for j in jobs]
    for net, method, best in found:
        print(f"{net:12s} {method:12s} max batch {best} under {args.device_memory_gb} GiB")


if __name__ == "__main__":
    _main()
