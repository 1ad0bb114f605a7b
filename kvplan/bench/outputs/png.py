"""plot.png: TTFT p50/p99 and preemptions vs concurrency, the predicted onsets drawn in (only when matplotlib is
installed, the ``bench`` extra; not with KVPLAN_NO_PLOT set)."""

from __future__ import annotations

import io
import os

from kvplan.bench.outputs.registry import output
from kvplan.bench.results import BenchSummary
from kvplan.bench.store import PLOT_FILE, RunStore
from kvplan.term import printable

#: Set (to anything but "" or "0") to write no plot.png: importing matplotlib and drawing took 1.5 s of a 3.5 s
#: `kvplan bench` run against a local server (the 2-core EPYC, 2026-12-07), and report.html draws the same charts.
NO_PLOT_ENV = "KVPLAN_NO_PLOT"


@output("png", PLOT_FILE, order=40)
def write_png(summary: BenchSummary, store: RunStore) -> bytes | None:
    if os.environ.get(NO_PLOT_ENV, "") not in ("", "0"):
        return None
    try:
        return plot_png(summary)
    except ImportError:  # no matplotlib: the HTML report draws the same charts
        return None


def plot_png(summary: BenchSummary) -> bytes | None:
    """TTFT p50/p99 and preemptions vs concurrency, the predicted onsets drawn in."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = [p for p in summary.points if p.status == "ok" and p.ttft.p50 is not None and p.ttft.p99 is not None]
    if not points:
        return None
    xs = [p.concurrency for p in points]
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=110)
    log_x = max(xs) / max(1, min(xs)) >= 16
    ax2 = ax.twinx()
    ax.set_zorder(ax2.get_zorder() + 1)  # the lines over the bars
    ax.patch.set_visible(False)
    pre = [p.server.preemptions or 0 for p in points]
    widths = [0.08 * x for x in xs] if log_x else [0.4] * len(xs)
    ax2.bar(xs, pre, width=widths, alpha=0.3, color="tab:red", label="preemptions")
    ax2.set_ylabel("preemptions in the point")
    # The count starts at 0 and is whole: no preemption at all is an axis of 0-1, not matplotlib's -0.04-0.04.
    ax2.set_ylim(0, preemption_axis_top(pre))
    ax2.yaxis.get_major_locator().set_params(integer=True)
    ax.plot(xs, [p.ttft.p50 * 1000 for p in points], "o-", label="TTFT p50")
    ax.plot(xs, [p.ttft.p99 * 1000 for p in points], "s-", label="TTFT p99")
    ax.set_xlabel("concurrent streams")
    ax.set_ylabel("TTFT (ms)")
    if log_x:
        from matplotlib.ticker import ScalarFormatter

        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.set_xticks(xs)
        ax.tick_params(axis="x", labelsize=8)
    pred = summary.prediction
    if pred is not None and pred.first_kv_wait:
        ax.axvline(pred.first_kv_wait, color="tab:orange", linestyle="--",
                   label=f"predicted first KV wait ({pred.first_kv_wait})")
    if pred is not None and pred.first_preemption:
        ax.axvline(pred.first_preemption, color="tab:red", linestyle=":", linewidth=2,
                   label=f"predicted first preemption ({pred.first_preemption})")
    handles = ax.get_legend_handles_labels()
    h2 = ax2.get_legend_handles_labels()
    ax.legend(handles[0] + h2[0], handles[1] + h2[1], loc="upper left", fontsize=8)
    # A title is one short line: a 1 MB model name from a server took matplotlib over a minute to lay out.
    ax.set_title(printable(f"{summary.model}: {summary.workload}", 160), fontsize=9)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()


def preemption_axis_top(counts: list[float]) -> float:
    """The top of the preemption axis: 10% above the most, and 1 when there are none (the axis starts at 0)."""
    return max(1.0, max(counts, default=0.0) * 1.1)
