"""The package's import graph, read statically (every ``import`` statement, deferred ones inside functions
included): no cycle among src/eto_train's modules, and the config schema at the base of the house (it
imports no stage, trainer, rollout, pair, export or environment adapter module)."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"


def _modules() -> dict[str, Path]:
    out = {}
    for f in (SRC / "eto_train").rglob("*.py"):
        parts = list(f.relative_to(SRC).with_suffix("").parts)
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return out


def import_graph() -> dict[str, set[str]]:
    """module -> the project modules it names in an import (a package's ``__init__`` running first is
    Python's doing, not an edge: a submodule importing its own package is no cycle)."""
    mods = _modules()

    def known(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {m: set() for m in mods}
    for m, f in mods.items():
        package = m if f.name == "__init__.py" else m.rpartition(".")[0]
        for node in ast.walk(ast.parse(f.read_text(), str(f))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([node.module] if node.module else []))
                # `from pkg import mod` names the submodule; `from mod import name` the module
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            else:
                continue
            graph[m] |= {t for t in map(known, targets) if t and t != m and t.startswith("eto_train")}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack, on, out = [], set(), []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root), on.add(root)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w), on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return out


def test_the_cycle_finder_finds_a_hand_made_cycle():
    g = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(g) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_in_the_package():
    graph = import_graph()
    assert len(graph) > 50 and "eto_train.config" in graph["eto_train.envs.textworld_express"]
    found = cycles(graph)
    assert found == [], "import cycles (deferred imports count): " + "; ".join(
        " <-> ".join(c) + " [" + ", ".join(f"{a}->{b}" for a in c for b in sorted(graph[a]) if b in c) + "]"
        for c in found)


def test_the_config_schema_imports_no_stage_trainer_rollout_pair_export_or_adapter():
    graph = import_graph()
    below = {"eto_train.config"}
    todo = ["eto_train.config"]
    while todo:  # everything config reaches
        for n in graph[todo.pop()] - below:
            below.add(n)
            todo.append(n)
    high = sorted(m for m in below if m.startswith(("eto_train.stages", "eto_train.training", "eto_train.rollouts"))
                  or m in ("eto_train.envs.textworld_express", "eto_train.envs.sciworld", "eto_train.pretrain.transcripts",
                           "eto_train.pairs", "eto_train.export"))
    assert high == []
