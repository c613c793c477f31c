"""The import graph, read statically with `ast` (imports inside functions included): the floors,
no cycles, one namespace, and a device harness that needs only numpy and a runtime.

Each test lists every violation it finds at once, as `file:line: what`.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# Repository folder -> the package it installs as (pyproject's package-dir).
FOLDERS = {"edgebert": "edgebert", "export": "edgebert.export", "quantize": "edgebert.quantize",
           "device_tests": "edgebert.device_tests"}

# Floors, by module-name prefix (the longest prefix wins; "edgebert" alone is the package __init__).
# A module may import its own floor and those below it, never one above.
FLOORS = {
    "edgebert": 0, "edgebert.errors": 0, "edgebert.config": 0, "edgebert.device_tests": 0,
    "edgebert.model": 1, "edgebert.families": 1, "edgebert.checkpoint": 1, "edgebert.tokenizer": 1,
    "edgebert.data": 1, "edgebert.stats": 1,
    "edgebert.passes": 2, "edgebert.export": 2, "edgebert.quantize": 2,
    "edgebert.pipeline": 3, "edgebert.bench": 3, "edgebert.targets": 3,
    "edgebert.cli": 4,
}
# Floor 2 holds three neighbours that stay apart: what one may import from another.
NEIGHBOURS = {
    # export's public API; QAT's training loop and distillation loss; the INT4 word grid prune trains on
    "edgebert.quantize": ("edgebert.export", "edgebert.passes.train", "edgebert.passes.losses", "edgebert.passes.int4"),
    "edgebert.export": (),
    "edgebert.passes": (),
}
BARE = {"export", "quantize", "device_tests"}  # repository folders that are not top-level packages
RUNTIMES = {"numpy", "onnxruntime", "ai_edge_litert", "tflite_runtime"}
TEXT = ("edgebert.device_tests.text", "tokenizers")  # `run --text` alone tokenizes, so it alone imports tokenizers


def _module_name(path: Path) -> str:
    folder, *rest = path.relative_to(ROOT).with_suffix("").parts
    parts = [FOLDERS[folder], *rest]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _sources() -> dict[str, Path]:
    return {_module_name(p): p for folder in FOLDERS for p in sorted((ROOT / folder).rglob("*.py"))}


MODULES = _sources()


def _imports(name: str, path: Path) -> list[tuple[int, str, int]]:
    """(line, imported name, relative level) for every import in the file, at any depth; relative
    imports resolved, `from pkg import sub` resolved to the submodule when there is one."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name, 0) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.append((node.lineno, sub if sub in MODULES else base, node.level))
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module"
              and node.args and isinstance(node.args[0], ast.Constant) and not node.args[0].value.startswith(".")):
            found.append((node.lineno, node.args[0].value, 0))
    return found


def _internal(target: str) -> str | None:
    """The package module an import lands on (the longest known prefix), or None if it is external."""
    parts = target.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in MODULES:
            return ".".join(parts[:n])
    return None


def _group(name: str) -> str | None:
    """The FLOORS prefix a module belongs to."""
    if name == "edgebert":
        return name
    matches = [p for p in FLOORS if p != "edgebert" and (name == p or name.startswith(p + "."))]
    return max(matches, key=len) if matches else None


def _report(found: list[str], what: str) -> None:
    """Fail with every violation at once, one per line, without the test's source around it."""
    if found:
        pytest.fail(f"{len(found)} {what}:\n" + "\n".join(found), pytrace=False)


def _where(path: Path, line: int) -> str:
    return f"{path.relative_to(ROOT)}:{line}"


EDGES = {name: [(line, _internal(target), target, level) for line, target, level in _imports(name, path)]
         for name, path in MODULES.items()}


def test_every_module_has_a_floor():
    missing = [f"{MODULES[name].relative_to(ROOT)}: {name} matches no prefix in FLOORS; place it on a floor"
               for name in MODULES if _group(name) is None]
    _report(missing, "modules without a floor")


def test_nothing_imports_upward_or_across_floor_2():
    found = []
    for name, edges in EDGES.items():
        mine = _group(name)
        for line, target, _, _ in edges:
            theirs = _group(target) if target else None
            if mine is None or theirs is None or theirs == mine:
                continue
            if FLOORS[theirs] > FLOORS[mine]:
                found.append(f"{_where(MODULES[name], line)}: {name} (floor {FLOORS[mine]}) imports {target} "
                             f"(floor {FLOORS[theirs]}): upward")
            elif FLOORS[theirs] == FLOORS[mine] == 2:
                allowed = NEIGHBOURS[mine]
                public = not any(part.startswith("_") for part in target.split("."))
                if not (public and any(target == a or target.startswith(a + ".") for a in allowed)):
                    found.append(f"{_where(MODULES[name], line)}: {name} imports {target}: floor 2 neighbours "
                                 f"stay apart ({mine} may import {', '.join(allowed) or 'none of them'})")
    _report(found, "upward or sideways imports")


def test_no_import_cycles():
    graph = {name: sorted({t for _, t, _, _ in edges if t and t != name}) for name, edges in EDGES.items()}
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def visit(v):  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    lines = []
    for component in cycles:
        hops = []
        for a, b in zip(path := _shortest_cycle(graph, component), path[1:]):
            line = next(ln for ln, t, _, _ in EDGES[a] if t == b)
            hops.append(f"{a} -> {b} ({_where(MODULES[a], line)})")
        lines.append(f"cycle among {', '.join(component)}:\n    " + "\n    ".join(hops))
    _report(lines, "import cycles")


def _shortest_cycle(graph: dict, component: list[str]) -> list[str]:
    """The shortest path from the component's first module back to itself, inside the component."""
    start, members = component[0], set(component)
    previous, frontier = {}, [start]
    while frontier:
        following = []
        for v in frontier:
            for w in graph[v]:
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    return [*reversed(path), start]
                if w in members and w not in previous:
                    previous[w] = v
                    following.append(w)
        frontier = following
    raise AssertionError(f"no cycle through {start}")  # a strongly connected component always has one


def test_no_bare_top_level_names():
    """`export`, `quantize` and `device_tests` are edgebert.*; only the harness, run alone on a device,
    knows itself as `device_tests` (and then only through relative imports)."""
    scripts = {f"bench.{p.stem}": p for p in sorted((ROOT / "bench").glob("*.py"))}
    found = []
    for name, path in {**MODULES, **scripts}.items():
        for line, target, level in _imports(name, path):
            if level == 0 and target.split(".")[0] in BARE:
                found.append(f"{_where(path, line)}: {name} imports {target}; import edgebert.{target}")
    _report(found, "imports of bare top-level names")


def test_device_tests_imports_only_stdlib_numpy_runtimes_and_itself():
    """The harness folder is copied alone to a board or phone: no torch, no edgebert, relative imports;
    tokenizers in the --text module only."""
    allowed = set(sys.stdlib_module_names) | RUNTIMES
    found = []
    for name, edges in EDGES.items():
        if _group(name) != "edgebert.device_tests":
            continue
        for line, _, target, level in edges:
            inside = target == "edgebert.device_tests" or target.startswith("edgebert.device_tests.")
            if level and not inside:
                found.append(f"{_where(MODULES[name], line)}: {name} imports {target}, outside the harness")
            elif not level and target.split(".")[0] not in allowed and (name, target.split(".")[0]) != TEXT:
                found.append(f"{_where(MODULES[name], line)}: {name} imports {target}: use the stdlib, numpy, "
                             "a runtime, or a relative import of the harness")
    _report(found, "harness imports outside the stdlib, numpy and the runtimes")


def test_bench_scripts_do_not_edit_sys_path():
    """bench/ scripts import edgebert.* as installed; `python bench/x.py` puts bench/ on the path itself."""
    found = []
    for path in sorted((ROOT / "bench").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Attribute) and node.attr == "path" and isinstance(node.value, ast.Name)
                    and node.value.id == "sys"):
                found.append(f"{_where(path, node.lineno)}: uses sys.path")
    _report(found, "sys.path edits in bench/")


def test_the_walk_sees_relative_and_function_level_imports():
    """The checks above are only as good as the walk: it must resolve these as the interpreter does."""
    targets = {t for _, t, _, _ in EDGES["edgebert.device_tests.harness"]}
    assert {"edgebert.device_tests.files", "edgebert.device_tests.evalset"} <= targets  # from . import / from .x
    assert "edgebert.device_tests.probe" in {t for _, t, _, _ in EDGES["edgebert.device_tests.cli"]}  # in main()
    assert "edgebert.errors" in {t for _, t, _, _ in EDGES["edgebert.data.tasks"]}  # from ..errors
    assert _group("edgebert.data.tasks") == "edgebert.data" and _group("edgebert") == "edgebert"
