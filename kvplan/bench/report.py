"""The run's results, written offline: summary.json, report.md and plot.png (matplotlib Agg)."""

from __future__ import annotations

import json
from typing import Any

from kvplan.bench import store as st


def write_reports(store: st.RunStore, summary: Any) -> None:
    """Write the summary JSON, the Markdown report and the plot (the plot only with matplotlib)."""
    store.write_text(st.SUMMARY_FILE, summary.model_dump_json(indent=2) + "\n")
    store.write_text(st.REPORT_FILE, markdown(summary))
    try:
        png = plot_png(summary)
    except ImportError:
        png = None
    if png is not None:
        import os

        tmp = store.path / (st.PLOT_FILE + ".tmp")
        if os.path.lexists(tmp):
            os.unlink(tmp)
        with os.fdopen(st._open_nofollow(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL), "wb") as fh:
            fh.write(png)
        os.replace(tmp, store.path / st.PLOT_FILE)


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.1f}"


def _num(value: Any, fmt: str = ",") -> str:
    if value is None:
        return "-"
    return format(value, fmt)


def _onset_cell(measured: dict | None, predicted: int | None, has_prediction: bool) -> str:
    if not measured:
        return "not searched"
    first = measured.get("first")
    if first is None:
        text = f"none up to {measured.get('searched_up_to')}"
    else:
        text = str(first) if measured.get("exact", True) else f"<= {first}"
    if has_prediction:
        text += " (agrees)" if first == predicted else " (differs)"
    return text


def markdown(summary: Any) -> str:
    """The report: capacity and onsets predicted vs measured, then one row per point."""
    s = summary
    pred = s.prediction or {}
    cap = s.capacity or {}
    planner = s.planner or {}
    lines = [f"# kvplan bench: {s.model}", ""]
    lines.append(f"- workload: {s.workload}")
    if s.engine_command:
        lines.append(f"- engine: `{s.engine_command}`")
    else:
        lines.append(f"- server: {s.base_url} (attached)")
    lines.append(f"- status: {s.status}" + (f" ({s.error})" if s.error and s.status != "complete" else ""))
    lines += ["", "## KV capacity", "", "| | planner | engine reports |", "|---|---:|---:|"]
    p_blocks = planner.get("num_blocks")
    p_tokens = planner.get("kv_cache_tokens")
    lines.append(f"| blocks (incl. the null block) | {_num(p_blocks)} | {_num(cap.get('num_blocks'))} |")
    lines.append(f"| block size | {_num(planner.get('block_size'))} | {_num(cap.get('block_size'))} |")
    lines.append(f"| KV cache tokens | {_num(p_tokens)} | {_num(cap.get('kv_cache_tokens'))} |")
    if planner.get("error"):
        lines += ["", f"Planner: {planner['error']}"]
    lines += ["", f"Capacity read from: {cap.get('source') or 'nothing (no log line, no cache_config_info)'}."]
    lines += ["", "## Onsets", "", "| onset | predicted (block rule) | measured |", "|---|---:|---|"]
    measured = s.measured or {}
    for key, name in (("first_kv_wait", "first concurrency that waits for KV"),
                      ("first_preemption", "first concurrency with preemptions")):
        p = pred.get(key) if pred else None
        p_text = ("never" if p is None else str(p)) if pred else "-"
        lines.append(f"| {name} | {p_text} | {_onset_cell(measured.get(key), p, bool(pred))} |")
    if pred:
        lines += ["", (
            f"Block rule on the engine's pool: {pred['num_blocks']} blocks of {pred['block_size']} "
            f"({pred['usable_blocks']} usable); a request is admitted with {pred['admit_blocks']} free blocks "
            f"and peaks at {pred['peak_blocks']}"
            + ("" if pred.get("exact") else " (approximate: requests are not identical; mean lengths used)")
            + "."
        )]
    lines += ["", "## Points", ""]
    head = ("| concurrency | predicted | measured | preemptions | peak waiting | KV fill predicted | KV peak measured "
            "| TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms | TPOT p50 ms | E2E p99 ms | output tok/s | requests ok |")
    lines += [head, "|" + "---:|" * 15]
    for pt in s.points:
        srv = pt.server or {}
        predicted = pt.predicted or {}
        kv_pred = predicted.get("kv_fill")
        kv_meas = srv.get("peak_kv_usage")
        lines.append(
            f"| {pt.concurrency} | {predicted.get('label', '-')} | {pt.label} | {_num(_int(srv.get('preemptions')))} "
            f"| {_num(_int(srv.get('peak_waiting')))} | {'-' if kv_pred is None else f'{kv_pred:.0%}'} "
            f"| {'-' if kv_meas is None else f'{kv_meas:.0%}'} | {_ms(pt.ttft.get('p50'))} | {_ms(pt.ttft.get('p99'))} "
            f"| {_ms(pt.itl.get('p50'))} | {_ms(pt.itl.get('p99'))} | {_ms(pt.tpot.get('p50'))} "
            f"| {_ms(pt.e2e.get('p99'))} | {_num(pt.throughput_tok_s, ',.0f')} | {pt.requests_ok}/{pt.requests} |"
        )
    for pt in s.points:
        for note in pt.notes:
            lines.append(f"\nConcurrency {pt.concurrency}: {note}.")
    failed = [pt for pt in s.points if pt.status != "ok"]
    for pt in failed:
        lines.append(f"\nPoint at concurrency {pt.concurrency} failed: {pt.error}")
    lines += ["", "Latencies count from each request's scheduled time (closed loop: the end of the stream's "
              "previous request). TTFT = first output chunk; ITL = gaps between output chunks; "
              "TPOT = (E2E - TTFT) / (output tokens - 1); output tok/s counts completed requests.", ""]
    return "\n".join(lines)


def _int(value: Any) -> int | None:
    return None if value is None else int(round(value))


def plot_png(summary: Any) -> bytes | None:
    """TTFT p50/p99 and preemptions vs concurrency, the predicted onsets drawn in."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = [p for p in summary.points if p.status == "ok" and p.ttft.get("p50") is not None]
    if not points:
        return None
    xs = [p.concurrency for p in points]
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=110)
    log_x = max(xs) / max(1, min(xs)) >= 16
    ax2 = ax.twinx()
    ax.set_zorder(ax2.get_zorder() + 1)  # the lines over the bars
    ax.patch.set_visible(False)
    pre = [(p.server or {}).get("preemptions") or 0 for p in points]
    widths = [0.08 * x for x in xs] if log_x else [0.4] * len(xs)
    ax2.bar(xs, pre, width=widths, alpha=0.3, color="tab:red", label="preemptions")
    ax2.set_ylabel("preemptions in the point")
    ax.plot(xs, [p.ttft["p50"] * 1000 for p in points], "o-", label="TTFT p50")
    ax.plot(xs, [p.ttft["p99"] * 1000 for p in points], "s-", label="TTFT p99")
    ax.set_xlabel("concurrent streams")
    ax.set_ylabel("TTFT (ms)")
    if log_x:
        from matplotlib.ticker import ScalarFormatter

        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.set_xticks(xs)
        ax.tick_params(axis="x", labelsize=8)
    pred = summary.prediction or {}
    if pred.get("first_kv_wait"):
        ax.axvline(pred["first_kv_wait"], color="tab:orange", linestyle="--",
                   label=f"predicted first KV wait ({pred['first_kv_wait']})")
    if pred.get("first_preemption"):
        ax.axvline(pred["first_preemption"], color="tab:red", linestyle=":", linewidth=2,
                   label=f"predicted first preemption ({pred['first_preemption']})")
    handles = ax.get_legend_handles_labels()
    h2 = ax2.get_legend_handles_labels()
    ax.legend(handles[0] + h2[0], handles[1] + h2[1], loc="upper left", fontsize=8)
    ax.set_title(f"{summary.model}: {summary.workload}", fontsize=9)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()


def summary_json(summary: Any) -> dict[str, Any]:
    return json.loads(summary.model_dump_json())
