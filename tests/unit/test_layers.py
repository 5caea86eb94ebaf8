"""The layers of ``zerobatch_core``: each wing imports only the wings below it, and no two
modules import each other, directly or through others (README, "Layout").

Every import counts: at module level, inside functions (imported lazily) and under
``TYPE_CHECKING``. The graph is read from the source with ``ast``, so a violation is found
without importing anything (an optional framework that is missing hides nothing).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

PACKAGE = "zerobatch_core"
ROOT = Path(__file__).resolve().parents[2] / PACKAGE

LEAVES = "leaves"
"""The top-level helper modules every wing may use: errors, redaction, arguments, closing, the
serving orders and the version."""

ALLOWED: dict[str, frozenset[str]] = {
    LEAVES: frozenset({LEAVES}),
    "files": frozenset({LEAVES, "files"}),
    "stores": frozenset({LEAVES, "stores"}),
    "datasets": frozenset({LEAVES, "files", "stores", "datasets"}),
    "live": frozenset({LEAVES, "files", "stores", "datasets", "live"}),
    "delivery": frozenset({LEAVES, "files", "stores", "datasets", "live", "delivery"}),
    "tokenization": frozenset({LEAVES, "tokenization"}),
    "ingest": frozenset({LEAVES, "files", "stores", "datasets", "live", "tokenization", "ingest"}),
    "cli": frozenset(
        {LEAVES, "files", "stores", "datasets", "live", "delivery", "tokenization", "ingest", "cli"}
    ),
}
"""What each wing may import. Files and stores know nothing of each other (a store holds bytes,
not LLMBATCH), tokenization knows nothing of the format, and only the command line and the
package's own ``__init__`` (the public API) see everything."""

TOP = "package"
"""``zerobatch_core/__init__.py``, ``__main__.py`` and ``_moved.py``: the public API, the
``python -m`` entry and the old module paths, which may import every wing."""


def module_names(root: Path = ROOT) -> dict[str, Path]:
    """Dotted name -> source file of every module of the package (packages by ``__init__``)."""
    names = {}
    for path in sorted(root.rglob("*.py")):
        parts = [PACKAGE, *path.relative_to(root).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def wing_of(module: str) -> str:
    """The wing a module belongs to: its subpackage, ``leaves`` or the package's top."""
    parts = module.split(".")
    if len(parts) == 1 or parts[1] in {"__main__", "_moved"}:
        return TOP
    if len(parts) == 2 and not (ROOT / parts[1]).is_dir():
        return LEAVES
    return parts[1]


def imports_of(module: str, source: str, known: Mapping[str, object]) -> set[str]:
    """The package's modules that ``source`` (module ``module``) imports, anywhere in it.

    ``from pkg import name`` counts as an import of ``pkg.name`` when that is a module, else of
    ``pkg``; the implicit imports of parent packages are not counted (as in import-linter)."""
    is_package = module.count(".") == 0 or f"{module}.__init__" in known or _is_package(module)
    here = module.split(".") if is_package else module.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found.add(sub if sub in known else target)
    return {name for name in found if name in known and name != module}


def _is_package(module: str) -> bool:
    return (ROOT / Path(*module.split(".")[1:]) / "__init__.py").is_file()


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the package's modules it imports."""
    names = module_names(root)
    return {name: imports_of(name, path.read_text(), names) for name, path in names.items()}


def layer_violations(graph: Mapping[str, set[str]]) -> list[str]:
    """Every import of a wing that its own wing may not use, as ``importer -> imported``."""
    out = []
    for module, targets in sorted(graph.items()):
        wing = wing_of(module)
        if wing == TOP:
            continue
        allowed = ALLOWED.get(wing)
        if allowed is None:
            out.append(f"{module}: wing {wing!r} has no place in the layers (add it to ALLOWED)")
            continue
        out.extend(
            f"{module} ({wing}) -> {target} ({wing_of(target)})"
            for target in sorted(targets)
            if wing_of(target) not in allowed
        )
    return out


def cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> Iterator[None]:
        # Iterative through generators: deep chains never hit the recursion limit.
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                yield from visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                group.append(top)
                if top == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))
        yield None

    for node in sorted(graph):
        if node not in index:
            for _ in visit(node):
                pass
    return sorted(found)


# -- the package itself ------------------------------------------------------------------------


def test_every_wing_imports_only_the_wings_below_it() -> None:
    assert layer_violations(import_graph()) == []


def test_no_modules_import_each_other() -> None:
    assert cycles(import_graph()) == []


def test_every_module_is_in_a_known_wing() -> None:
    wings = {wing_of(name) for name in module_names()}
    assert wings <= {TOP, *ALLOWED}, wings - {TOP, *ALLOWED}
    assert wings >= {"files", "stores", "datasets", "live", "delivery", "ingest", "cli"}


def test_the_graph_sees_lazy_and_type_checking_imports() -> None:
    graph = import_graph()
    # sources.py opens a LiveSource only when a live descriptor exists: imported in a function.
    assert f"{PACKAGE}.live.source" in graph[f"{PACKAGE}.delivery.sources"]
    # cli/common.py names ingest's Progress in annotations only: imported under TYPE_CHECKING.
    assert f"{PACKAGE}.ingest.convert" in graph[f"{PACKAGE}.cli.common"]


# -- the checks catch what they are for --------------------------------------------------------


def _graph_with(extra: dict[str, set[str]]) -> dict[str, set[str]]:
    graph = {name: set(targets) for name, targets in import_graph().items()}
    for module, targets in extra.items():
        graph.setdefault(module, set()).update(targets)
    return graph


@pytest.mark.parametrize(
    ("importer", "imported"),
    [
        ("files.reader", "delivery.loader"),  # the file format reaching up to the loader
        ("stores.store", "files.reader"),  # a store that knows LLMBATCH
        ("files.writer", "stores.store"),  # ... and the other way
        ("datasets.dataset", "live.source"),
        ("live.producer", "delivery.stream"),
        ("errors", "datasets.dataset"),  # a leaf reaching into a wing
        ("tokenization.byte", "files.reader"),
        ("ingest.convert", "cli.main"),
    ],
)
def test_an_upward_import_is_a_violation(importer: str, imported: str) -> None:
    graph = _graph_with({f"{PACKAGE}.{importer}": {f"{PACKAGE}.{imported}"}})
    violations = layer_violations(graph)
    assert len(violations) == 1 and violations[0].startswith(f"{PACKAGE}.{importer} ")


def test_an_upward_import_in_the_source_is_found() -> None:
    module = f"{PACKAGE}.files.reader"
    source = "def late():\n    from ..delivery import loader\n    return loader\n"
    found = imports_of(module, source, module_names())
    assert found == {f"{PACKAGE}.delivery.loader"}
    assert layer_violations(_graph_with({module: found})) != []


def test_two_modules_importing_each_other_are_a_cycle() -> None:
    a, b = f"{PACKAGE}.stores.store", f"{PACKAGE}.stores.object_stores"
    assert sorted([a, b]) in cycles(_graph_with({a: {b}}))
    c = f"{PACKAGE}.delivery.loader"
    through = _graph_with({f"{PACKAGE}.datasets.dataset": {c}})  # loader -> dataset -> loader
    assert any({c, f"{PACKAGE}.datasets.dataset"} <= set(group) for group in cycles(through))
