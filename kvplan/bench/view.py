"""The live progress display (rich, on stderr) and a silent stand-in."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from kvplan.term import esc, make_console
from kvplan.units import format_ms

if TYPE_CHECKING:
    from kvplan.bench.results import PointResult


class NullView:
    """Shows nothing (library use, tests)."""

    def message(self, text: str) -> None: ...
    def engine_starting(self, elapsed_s: float) -> None: ...
    def engine_ready(self, elapsed_s: float) -> None: ...
    def point_started(self, concurrency: int | str, total: int) -> None: ...
    def request_done(self, ok: bool) -> None: ...
    def scrape(self, values: dict[str, float], waiting_capacity: float | None) -> None: ...
    def point_finished(self, point: PointResult) -> None: ...
    def close(self) -> None: ...


class RichView(NullView):
    """A rich Progress: one line for the engine start, one bar per point with live gauges."""

    def __init__(self) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        self.console = make_console(stderr=True)
        self.progress = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(bar_width=24),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[gauges]}"),
            console=self.console,
            transient=False,
        )
        self.progress.start()
        self._engine_task = None
        self._task = None

    def message(self, text: str) -> None:
        self.progress.console.print(text)

    def engine_starting(self, elapsed_s: float) -> None:
        if self._engine_task is None:
            self._engine_task = self.progress.add_task("starting engine", total=None, gauges="")

    def engine_ready(self, elapsed_s: float) -> None:
        if self._engine_task is not None:
            self.progress.update(self._engine_task, description=f"engine ready in {elapsed_s:.0f} s", total=1, completed=1)

    def point_started(self, concurrency: int | str, total: int) -> None:
        label = concurrency if isinstance(concurrency, str) else f"concurrency {concurrency:>4}"
        self._task = self.progress.add_task(label, total=total or None, gauges="")

    def request_done(self, ok: bool) -> None:
        if self._task is not None:
            self.progress.advance(self._task)

    def scrape(self, values: dict[str, float], waiting_capacity: float | None) -> None:
        if self._task is None:
            return
        kv = values.get("kv_usage")
        text = (
            f"running {values.get('running', 0):.0f}  waiting {values.get('waiting', 0):.0f}  "
            f"KV {'' if kv is None else f'{kv:.0%}'}  preemptions {values.get('preemptions', 0):.0f}"
        )
        self.progress.update(self._task, gauges=text)

    def point_finished(self, point: PointResult) -> None:
        if self._task is None:
            return
        self.progress.update(self._task, gauges=_outcome(point))
        self._task = None

    def close(self) -> None:
        self.progress.stop()


class LineView(NullView):
    """A plain line on stderr as each point ends: the progress a CI log keeps (``--json`` with stderr not a
    terminal, where a live display would show nothing until the end). Nothing before a point ends, and
    nothing for a point that failed: the run's error line says that, alone."""

    def __init__(self) -> None:
        self.console = make_console(stderr=True)
        self._point = ""
        self._started_s = 0.0

    def point_started(self, concurrency: int | str, total: int) -> None:
        self._point = esc(concurrency if isinstance(concurrency, str) else f"concurrency {concurrency}")
        self._started_s = time.monotonic()

    def point_finished(self, point: PointResult) -> None:
        if point.status != "ok":
            return
        elapsed_s = time.monotonic() - self._started_s
        self.console.print(f"{self._point}: {point.requests_ok} of {point.requests} requests in {elapsed_s:.1f} s, "
                           + _outcome(point))


def _outcome(point: PointResult) -> str:
    """A finished point in one line (rich markup): its label, preemptions and TTFT p99, or its error."""
    if point.status != "ok":
        return f"[red]failed[/]: {esc(point.error)}"
    text = (
        f"[{'red' if point.preempted else 'yellow' if point.waited_for_kv else 'green'}]{point.label}[/]  "
        f"preemptions {point.server.preemptions or 0:.0f}  "
        f"TTFT p99 {_ms(point.ttft.p99)}"
    )
    pred = point.predicted_latency
    if pred is not None and pred.ttft is not None:
        text += f" (predicted {_ms(pred.ttft.p99)})"
    return text


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{format_ms(seconds)} ms"
