"""The package's structure: no import cycle anywhere in ``lowbit/``, function-level imports included;
no dated measurement or run log in its sources (they live in ``benchmarks/results.csv``).

Every module is parsed (no import runs) and every ``import`` / ``from ... import`` statement is an
edge, wherever it stands (module level, inside a function or a branch). Importing ``a.b.c`` runs the
``__init__`` of every package on the way (``a.b``) as well as ``a.b.c``: each of those is an edge,
except, at module level, the packages that contain the importing module (they are being imported
already when it runs). Inside a function a containing package that is itself the import's target
counts: ``import lowbit`` or ``from .. import x`` in ``lowbit.kernels.y`` reaches back up to the
package's ``__init__`` and all it holds. ``from pkg import name`` is an edge to ``pkg.name`` too when
that is a module.
"""
import ast
import os
import re

import lowbit

ROOT = os.path.dirname(os.path.abspath(lowbit.__file__))


def _modules() -> dict:
    """module name -> (path, is_package) for every .py file under lowbit/."""
    out = {}
    base = os.path.dirname(ROOT)
    for dirpath, _, files in os.walk(ROOT):
        for f in files:
            if f.endswith(".py"):
                rel = os.path.relpath(os.path.join(dirpath, f), base)[:-3].replace(os.sep, ".")
                pkg = f == "__init__.py"
                out[rel[: -len(".__init__")] if pkg else rel] = (os.path.join(dirpath, f), pkg)
    return out


def _targets(name: str, importer: str, modules: dict, in_function: bool = False) -> set:
    """The lowbit modules that importing ``name`` from ``importer`` depends on (module docstring)."""
    parts = name.split(".")
    out = set()
    for i in range(1, len(parts) + 1):
        mod = ".".join(parts[:i])
        inside = importer == mod or (importer.startswith(mod + ".") and not (in_function and mod == name))
        if mod in modules and not inside:
            out.add(mod)
    return out


def _function_level(tree) -> set:
    """ids of the import statements inside a function or method body."""
    return {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
            for n in ast.walk(f) if isinstance(n, (ast.Import, ast.ImportFrom))}


def _edges(modules: dict) -> dict:
    graph = {}
    for mod, (path, is_pkg) in modules.items():
        tree = ast.parse(open(path, encoding="utf-8").read(), path)
        package = mod if is_pkg else mod.rpartition(".")[0]
        deps = set()
        local = _function_level(tree)
        for node in ast.walk(tree):
            in_function = id(node) in local
            if isinstance(node, ast.Import):
                for a in node.names:
                    deps |= _targets(a.name, mod, modules, in_function)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")
                    base = base[: len(base) - node.level + 1]
                    src = ".".join(base + ([node.module] if node.module else []))
                else:
                    src = node.module or ""
                if not src.startswith("lowbit"):
                    continue
                deps |= _targets(src, mod, modules, in_function)
                for a in node.names:
                    if f"{src}.{a.name}" in modules:
                        deps |= _targets(f"{src}.{a.name}", mod, modules, in_function)
        graph[mod] = deps
    return graph


def _cycle(graph: dict):
    """One cycle as a list of modules, or None (iterative DFS, three colours)."""
    colour, parent = {}, {}
    for start in sorted(graph):
        if colour.get(start):
            continue
        stack = [(start, iter(sorted(graph[start])))]
        colour[start] = 1
        while stack:
            node, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                colour[node] = 2
                stack.pop()
                continue
            if colour.get(nxt) == 1:
                path = [node]
                while path[-1] != nxt:
                    path.append(parent[path[-1]])
                return path[::-1] + [nxt]
            if not colour.get(nxt):
                colour[nxt], parent[nxt] = 1, node
                stack.append((nxt, iter(sorted(graph.get(nxt, ())))))
    return None


def test_no_import_cycle_in_lowbit():
    modules = _modules()
    graph = _edges(modules)
    assert len(modules) > 50 and sum(map(len, graph.values())) > 100  # the walk saw the package
    assert _cycle(graph) is None, " -> ".join(_cycle(graph))


def test_cycle_finder_sees_function_level_and_package_imports():
    """The walk itself: a function-level import closing a loop, and a loop through a package's
    ``__init__``, are both reported; a module-level import of the importer's own package is not an
    edge, a function-level one is."""
    modules = {"lowbit.a": (None, False), "lowbit.b": (None, False), "lowbit.p": (None, True),
               "lowbit.p.m": (None, False), "lowbit": (None, True)}
    assert _targets("lowbit.p.m", "lowbit.a", modules) == {"lowbit.p", "lowbit.p.m"}
    assert _targets("lowbit.p", "lowbit.p.m", modules) == set()
    assert _targets("lowbit", "lowbit.p.m", modules, in_function=True) == {"lowbit"}
    assert _targets("lowbit.p.m", "lowbit.p.q", modules, in_function=True) == {"lowbit.p.m"}
    assert _cycle({"lowbit.a": {"lowbit.b"}, "lowbit.b": {"lowbit.a"}}) == ["lowbit.a", "lowbit.b", "lowbit.a"]
    assert _cycle({"lowbit.a": {"lowbit.p"}, "lowbit.p": {"lowbit.p.m"}, "lowbit.p.m": {"lowbit.a"}}) is not None
    tree = ast.parse("import os\ndef f():\n    from .b import x\n")
    inner = [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert len(inner) == 1 and _function_level(tree) == {id(inner[0])}  # ast.walk reaches function bodies


_DATE = re.compile(r"20[0-9]{2}-[0-9]{2}-[0-9]{2}")
_RUN_LOG = re.compile(r"\bsession[ -]?[0-9]+|\bRESULTS\.md\b|\bcall [0-9]+\b", re.IGNORECASE)


def test_no_dates_or_run_logs_in_lowbit():
    """``grep -rE "20[0-9]{2}-[0-9]{2}-[0-9]{2}" lowbit/`` finds nothing, nor a session or call
    number of a benchmark run (the patterns are checked on a planted line first)."""
    assert _DATE.search("H200 (2026-12-01)") and _RUN_LOG.search("session 4 sweep") and _RUN_LOG.search("call 3:")
    hits = []
    for dirpath, _, files in os.walk(ROOT):
        for f in files:
            if f.endswith((".py", ".md", ".txt", ".json")):
                path = os.path.join(dirpath, f)
                for i, line in enumerate(open(path, encoding="utf-8"), 1):
                    if _DATE.search(line) or _RUN_LOG.search(line):
                        hits.append(f"{os.path.relpath(path, ROOT)}:{i}: {line.strip()[:80]}")
    assert not hits, "\n".join(hits)
