"""The import graph, read statically with `ast` (imports inside functions included): the floors (also
through `edgebert`'s lazy names and `import_module`), no cycles, one namespace, a device harness that needs
only numpy and a runtime, and bench/ scripts that use edgebert's public names only.

Each test lists every violation it finds at once, as `file:line: what`.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

import edgebert
from edgebert.device_tests import runtimes

ROOT = Path(__file__).resolve().parent.parent
# Repository folder -> the package it installs as (pyproject's package-dir).
FOLDERS = {"edgebert": "edgebert", "export": "edgebert.export", "quantize": "edgebert.quantize",
           "device_tests": "edgebert.device_tests"}

# Floors, by module-name prefix (the longest prefix wins; "edgebert" alone is the package __init__).
# A module may import its own floor and those below it, never one above.
FLOORS = {
    "edgebert": 0, "edgebert.errors": 0, "edgebert.config": 0, "edgebert.registry": 0, "edgebert.progress": 0,
    "edgebert.device_tests": 0,
    "edgebert.model": 1, "edgebert.families": 1, "edgebert.checkpoint": 1, "edgebert.tokenizer": 1,
    "edgebert.data": 1, "edgebert.stats": 1,
    "edgebert.passes": 2, "edgebert.export": 2, "edgebert.quantize": 2,
    "edgebert.pipeline": 3, "edgebert.bench": 3, "edgebert.targets": 3,
    "edgebert.cli": 4, "edgebert.__main__": 4,
}
# Floor 2 holds three neighbours that stay apart: what one may import from another.
NEIGHBOURS = {
    # export's public API; QAT's training loop and distillation loss; the INT4 word grid prune trains on
    "edgebert.quantize": ("edgebert.export", "edgebert.passes.train", "edgebert.passes.losses", "edgebert.passes.int4"),
    "edgebert.export": (),
    "edgebert.passes": (),
}
BARE = {"export", "quantize", "device_tests"}  # repository folders that are not top-level packages
RUNTIMES = {"numpy", *(r.module.split(".")[0] for r in runtimes.RUNTIMES.values())}  # what the harness may import
# what a runtime's own class may import besides (the official ExecuTorch bindings take torch tensors)
NEEDS: dict[str, set[str]] = {}
for _runtime in runtimes.RUNTIMES.values():
    NEEDS.setdefault(f"edgebert.device_tests.{_runtime.model.partition(':')[0]}", set()).update(_runtime.needs)
LAZY = {name: f"edgebert.{module}" for name, module in edgebert._LAZY.items()}  # `from edgebert import X` loads these
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


def _absolute(module: str, level: int, package: str) -> str:
    """A relative import's target, as the interpreter resolves it from `package`."""
    if not level:
        return module
    anchor = package.split(".")[: len(package.split(".")) - (level - 1)]
    return ".".join([*anchor, *([module] if module else [])])


def _imports(name: str, path: Path) -> list[tuple[int, str, int]]:
    """(line, imported name, relative level) for every import in the file, at any depth; relative
    imports resolved, `from pkg import sub` resolved to the submodule when there is one, and a lazy name
    of `edgebert` (`from edgebert import load`, `edgebert.load`) to the module that defines it."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    anchors = {"__name__": name, "__package__": package}
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name, 0) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node.module or "", node.level, package)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                if base == "edgebert" and alias.name in LAZY:
                    sub = LAZY[alias.name]
                found.append((node.lineno, sub if sub in MODULES else base, node.level))
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "edgebert":
            if node.attr in LAZY:
                found.append((node.lineno, LAZY[node.attr], 0))
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module"
              and node.args and isinstance(node.args[0], ast.Constant)):
            target = node.args[0].value
            level = len(target) - len(target.lstrip("."))
            anchor = node.args[1] if len(node.args) > 1 else None
            within = (anchor.value if isinstance(anchor, ast.Constant) else
                      anchors.get(anchor.id) if isinstance(anchor, ast.Name) else None)
            if level and within is None:
                continue  # relative to a package the source does not spell out
            found.append((node.lineno, _absolute(target[level:], level, within or ""), 0))
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
    return f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}:{line}"


def _edges(name: str, path: Path) -> list[tuple[int, str | None, str, int]]:
    """(line, the package module it lands on or None, imported name, relative level) for each import."""
    return [(line, _internal(target), target, level) for line, target, level in _imports(name, path)]


EDGES = {name: _edges(name, path) for name, path in MODULES.items()}


def test_every_module_has_a_floor():
    missing = [f"{MODULES[name].relative_to(ROOT)}: {name} matches no prefix in FLOORS; place it on a floor"
               for name in MODULES if _group(name) is None]
    _report(missing, "modules without a floor")


def _floor_breaches(name: str, path: Path, edges) -> list[str]:
    """Each import of module `name` (source `path`) that reaches a higher floor, or across floor 2."""
    found = []
    mine = _group(name)
    for line, target, _, _ in edges:
        theirs = _group(target) if target else None
        if mine is None or theirs is None or theirs == mine:
            continue
        if FLOORS[theirs] > FLOORS[mine]:
            found.append(f"{_where(path, line)}: {name} (floor {FLOORS[mine]}) imports {target} "
                         f"(floor {FLOORS[theirs]}): upward")
        elif FLOORS[theirs] == FLOORS[mine] == 2:
            allowed = NEIGHBOURS[mine]
            public = not any(part.startswith("_") for part in target.split("."))
            if not (public and any(target == a or target.startswith(a + ".") for a in allowed)):
                found.append(f"{_where(path, line)}: {name} imports {target}: floor 2 neighbours "
                             f"stay apart ({mine} may import {', '.join(allowed) or 'none of them'})")
    return found


def test_nothing_imports_upward_or_across_floor_2():
    found = [f for name, edges in EDGES.items() for f in _floor_breaches(name, MODULES[name], edges)]
    _report(found, "upward or sideways imports")


def test_the_floor_check_sees_lazy_names_and_import_module(tmp_path):
    """`edgebert.load` is checkpoint's and `edgebert.build` model's (floor 1) however a floor-0 module reaches them."""
    source = tmp_path / "offender.py"
    source.write_text("from importlib import import_module\n"
                      "import edgebert\n"
                      "from edgebert import EdgebertError, load\n"
                      "\n"
                      "\n"
                      "def later():\n"
                      "    return edgebert.build, import_module('.checkpoint', 'edgebert'), edgebert.__version__\n")
    found = _floor_breaches("edgebert.config", source, _edges("edgebert.config", source))
    assert sorted(f.split(": ")[0] for f in found) == [f"{source}:3", f"{source}:7", f"{source}:7"]
    assert {f.split(" imports ")[1].split(" ")[0] for f in found} == {"edgebert.checkpoint", "edgebert.model"}


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
    tokenizers in the --text module only, and what a runtime needs (`Runtime.needs`) in its class's module only."""
    allowed = set(sys.stdlib_module_names) | RUNTIMES
    found = []
    for name, edges in EDGES.items():
        if _group(name) != "edgebert.device_tests":
            continue
        for line, _, target, level in edges:
            inside = target == "edgebert.device_tests" or target.startswith("edgebert.device_tests.")
            if level and not inside:
                found.append(f"{_where(MODULES[name], line)}: {name} imports {target}, outside the harness")
            elif (not level and target.split(".")[0] not in allowed | NEEDS.get(name, set())
                  and (name, target.split(".")[0]) != TEXT):
                found.append(f"{_where(MODULES[name], line)}: {name} imports {target}: use the stdlib, numpy, "
                             "a runtime, or a relative import of the harness")
    _report(found, "harness imports outside the stdlib, numpy and the runtimes")


def _private_reaches(path: Path) -> list[str]:
    """Each place a script imports or reads a private name (`_x`) of edgebert's packages; names of its own
    (bench/'s `_measure`) are its business."""
    tree = ast.parse(path.read_text(), str(path))
    bound, found = set(), []  # bound: the script's names for edgebert's modules and objects

    def private(dotted: str) -> bool:
        return any(p.startswith("_") and not p.endswith("__") for p in dotted.split("."))

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in (a for a in node.names if a.name.split(".")[0] == "edgebert"):
                bound.add(alias.asname or "edgebert")
                if private(alias.name):
                    found.append(f"{_where(path, node.lineno)}: imports {alias.name}")
        elif isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] == "edgebert":
            for alias in node.names:
                bound.add(alias.asname or alias.name)
                if private(f"{node.module}.{alias.name}"):
                    found.append(f"{_where(path, node.lineno)}: imports {node.module}.{alias.name}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and private(node.attr):
            root = node.value
            while isinstance(root, ast.Attribute):
                root = root.value
            if isinstance(root, ast.Name) and root.id in bound:
                found.append(f"{_where(path, node.lineno)}: reads {ast.unparse(node)}")
    return found


def test_bench_scripts_use_public_names_only():
    """bench/ measures edgebert as a user would run it: a private name it needs is one to make public."""
    _report([f for path in sorted((ROOT / "bench").glob("*.py")) for f in _private_reaches(path)],
            "private edgebert names used by bench/")


def test_the_bench_check_sees_private_names(tmp_path):
    script = tmp_path / "script.py"
    script.write_text("import edgebert.pipeline.compile\n"
                      "from edgebert.pipeline import compile as c\n"
                      "from edgebert.pipeline.compile import _key\n"
                      "from _measure import helper\n"
                      "\n"
                      "edgebert.pipeline.compile._key()\n"
                      "c._key(helper._own(), edgebert.__version__)\n")
    found = _private_reaches(script)
    assert [f.split(": ")[0] for f in found] == [f"{script}:3", f"{script}:6", f"{script}:7"]
    assert found[0].endswith("imports edgebert.pipeline.compile._key") and found[2].endswith("reads c._key")


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
