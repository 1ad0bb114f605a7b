"""The output registry: one entry per file a run writes from its typed summary (GuideLLM's
``GenerativeBenchmarkerOutput.register``). A new format is one module in this package holding one
``@output(name, file)`` function: kvplan/bench/outputs/__init__.py imports every module of the package."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from kvplan.bench.results import BenchSummary
from kvplan.bench.store import RunStore

#: What an output returns: the file's text, its bytes, its lines one at a time (a file that grows with the run, written
#: without holding it whole), several files by name (one per point: llm-d's benchmark reports), or None (nothing to
#: write, e.g. no matplotlib).
Render = Callable[[BenchSummary, RunStore], "str | bytes | Iterator[str] | dict[str, str] | None"]


@dataclass(frozen=True)
class Output:
    name: str  # e.g. "markdown"
    file: str  # the file it writes in the run folder, e.g. "report.md"; a pattern when it writes one a point
    render: Render
    order: int  # lower first; the summary is 0 (what `kvplan report` and --resume read back)


OUTPUTS: dict[str, Output] = {}


def output(name: str, file: str, order: int = 100) -> Callable[[Render], Render]:
    """Register ``render`` as the output ``name`` writing ``file``; two outputs of one name or one file are a bug."""

    def register(render: Render) -> Render:
        if name in OUTPUTS or any(o.file == file for o in OUTPUTS.values()):
            raise ValueError(f"output {name!r} ({file}) is registered twice")
        OUTPUTS[name] = Output(name, file, render, order)
        return render

    return register


def write_reports(store: RunStore, summary: BenchSummary) -> list[str]:
    """Every registered output of ``summary`` into ``store`` (text scrubbed of the run's secrets, nothing
    followed through a link: RunStore's writers), by ``order`` then name. Returns the files written."""
    written = []
    for out in sorted(OUTPUTS.values(), key=lambda o: (o.order, o.name)):
        content = out.render(summary, store)
        if content is None:
            continue
        if isinstance(content, dict):  # one file a point, each named by the output
            for name, text in content.items():
                store.write_text(name, text)
                written.append(name)
            continue
        if isinstance(content, bytes):
            store.write_bytes(out.file, content)
        else:
            store.write_text(out.file, content)
        written.append(out.file)
    return written
