"""The live progress display (rich, on stderr) and a silent stand-in."""

from __future__ import annotations

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
        if point.status == "ok":
            text = (
                f"[{'red' if point.preempted else 'yellow' if point.waited_for_kv else 'green'}]{point.label}[/]  "
                f"preemptions {point.server.preemptions or 0:.0f}  "
                f"TTFT p99 {_ms(point.ttft.p99)}"
            )
            pred = point.predicted_latency
            if pred is not None and pred.ttft is not None:
                text += f" (predicted {_ms(pred.ttft.p99)})"
        else:
            text = f"[red]failed[/]: {esc(point.error)}"
        self.progress.update(self._task, gauges=text)
        self._task = None

    def close(self) -> None:
        self.progress.stop()


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{format_ms(seconds)} ms"
