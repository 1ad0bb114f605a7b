"""The house's floors, held by a test: every internal import (at the top of a module or inside a function, but not
under ``if TYPE_CHECKING:``) goes to a lower floor or within its own, and no import cycle exists between modules.
A new module is placed by the first prefix of FLOORS it matches (the longest one); docs/architecture.md says why
each floor sits where it does."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "kvplan"

#: Floor of each package or module, lowest first. A module may import its own floor or any lower one.
FLOORS: dict[str, int] = {
    # 0: the ground: errors, units, paths (bounded readers, safe writers), statistics, terminal text
    "kvplan": 0, "kvplan.errors": 0, "kvplan.units": 0, "kvplan.paths": 0, "kvplan.stats": 0, "kvplan.term": 0,
    "kvplan.calibration": 0,
    # 1: facts about vLLM: its rules per release, platforms, metric names, engine flags; every floor above reads them
    "kvplan.vllm.rules": 1, "kvplan.vllm.platforms": 1, "kvplan.vllm.metric_names": 1, "kvplan.vllm.args": 1,
    "kvplan.sglang.rules": 1, "kvplan.sglang.metric_names": 1,  # SGLang's facts, beside vLLM's
    "kvplan.trtllm.rules": 1,  # TensorRT-LLM's
    # 2: what is planned for: the model, the hardware, the traffic
    "kvplan.model": 2, "kvplan.hardware": 2, "kvplan.traffic": 2,
    # 3: the planner
    "kvplan.plan": 3,
    # 4: vLLM-facing readers and the engine's own code: flags, start-up logs, twins, the probe
    "kvplan.vllm": 4, "kvplan.sglang": 4, "kvplan.trtllm": 4,
    # 5: one deployment resolved end to end (model + GPUs + settings -> plan)
    "kvplan.deploy": 5, "kvplan.engines": 5,
    # 6: the wings: bench, validate, gate
    "kvplan.bench": 6, "kvplan.validate": 6, "kvplan.gate": 6, "kvplan.api": 6,
    # 7: the command line
    "kvplan.cli": 7, "kvplan.__main__": 7,
}


def _floor(module: str) -> int:
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in FLOORS:
            return FLOORS[".".join(parts[:n])]
    raise AssertionError(f"{module} has no floor in FLOORS")


def _modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        name = ".".join(path.relative_to(ROOT.parent).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = path
    return out


def _type_checking_lines(tree: ast.Module) -> set[int]:
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                lines.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return lines


def internal_imports() -> dict[str, set[tuple[str, int]]]:
    """module -> {(imported internal module, line)}, TYPE_CHECKING imports left out."""
    modules = _modules()
    edges: dict[str, set[tuple[str, int]]] = defaultdict(set)
    for name, path in modules.items():
        tree = ast.parse(path.read_text())
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        skip = _type_checking_lines(tree)
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)) or node.lineno in skip:
                continue
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            for target in targets:
                if not target.startswith("kvplan"):
                    continue
                while target not in modules and "." in target:
                    target = target.rpartition(".")[0]
                if target != name:
                    edges[name].add((target, node.lineno))
    return edges


def test_every_import_goes_down_or_level():
    upward = sorted(f"{src}:{line} imports {dst} (floor {_floor(src)} -> {_floor(dst)})"
                    for src, targets in internal_imports().items() for dst, line in targets
                    if _floor(dst) > _floor(src))
    assert upward == []


def test_no_import_cycle():
    graph = {src: {dst for dst, _ in targets} for src, targets in internal_imports().items()}
    cycles = []
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append(" -> ".join(path[path.index(nxt):] + [nxt]))
            elif nxt not in state:
                visit(nxt)
        path.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    assert cycles == []


def test_every_module_has_a_floor():
    for name in _modules():
        _floor(name)


def test_imports_sit_at_the_top_outside_the_commands():
    """The graph a reader sees is the real one: outside kvplan/cli (where each command loads its own modules, so
    `kvplan size` does not pay for `bench`), no internal import hides inside a function. Heavy third-party ones
    (vllm, torch, matplotlib, aiohttp, rich...) may, and do."""
    hidden = []
    for name, path in _modules().items():
        if name.startswith("kvplan.cli"):
            continue
        tree = ast.parse(path.read_text())
        for func in ast.walk(tree):
            if isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
                hidden += [f"{name}:{node.lineno}" for node in ast.walk(func)
                           if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("kvplan")]
    assert sorted(set(hidden)) == []
