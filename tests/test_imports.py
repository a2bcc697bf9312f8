"""The package's import graph follows the rules of docs/architecture.md: no import cycle (module level or inside a
function), the low layers import only what sits below them (workloads -> isa <- engine; the
engine never sees workloads or reports), no module imports another's private names, and
matplotlib is imported in report/ alone."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "archsim"

# layer -> the layers (first component below archsim) it may import, besides itself
ALLOWED = {
    "isa": {"errors", "paths"},
    "config": {"errors", "paths"},
    "workloads": {"config", "errors", "isa", "paths"},
    "engine": {"config", "errors", "isa", "kernel_cache", "resources"},
    "report": {"errors"},
}


def _modules() -> dict[str, Path]:
    out = {}
    for p in ROOT.rglob("*.py"):
        parts = ("archsim",) + p.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


def _type_checking_lines(tree) -> set[int]:
    """Lines under ``if TYPE_CHECKING:`` (annotations only: not an import at run time)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for sub in node.body:
                out.update(range(sub.lineno, sub.end_lineno + 1))
    return out


def _package(mod: str, path: Path) -> str:
    """The package a module's relative imports start from."""
    return mod if path.name == "__init__.py" else mod.rpartition(".")[0]


def _from_target(package: str, node: ast.ImportFrom) -> str:
    """The module a ``from ... import`` names, relative levels resolved against ``package``."""
    if not node.level:
        return node.module
    base = package.split(".")[:len(package.split(".")) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(mods: dict[str, Path]):
    """(importer, imported module, imported name or None, line) for every import in archsim/."""
    for mod, path in mods.items():
        tree = ast.parse(path.read_text())
        skip = _type_checking_lines(tree)
        package = _package(mod, path)
        for node in ast.walk(tree):
            if getattr(node, "lineno", None) in skip:
                continue
            if isinstance(node, ast.Import):
                for a in node.names:
                    yield mod, a.name, None, node.lineno
            elif isinstance(node, ast.ImportFrom):
                target = _from_target(package, node)
                for a in node.names:
                    if f"{target}.{a.name}" in mods:
                        yield mod, f"{target}.{a.name}", None, node.lineno
                    else:
                        yield mod, target, a.name, node.lineno


def _layer(mod: str) -> str:
    parts = mod.split(".")
    return parts[1] if len(parts) > 1 else ""


@pytest.fixture(scope="module")
def graph():
    mods = _modules()
    return mods, list(_imports(mods))


def test_no_import_cycle(graph):
    mods, imports = graph
    edges: dict[str, set] = {m: set() for m in mods}
    for a, b, _, _ in imports:
        if b in mods and b != a:
            edges[a].add(b)
    # Tarjan's strongly connected components, iteratively
    index, low, on, stack, cycles, counter = {}, {}, set(), [], [], [0]
    for root in mods:
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges[w]))))
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
                        cycles.append(sorted(comp))
    assert not cycles, f"import cycles: {cycles}"


def test_layers_import_only_below(graph):
    mods, imports = graph
    bad = []
    for a, b, _, line in imports:
        la, lb = _layer(a), _layer(b)
        if b.startswith("archsim") and la in ALLOWED and lb != la and lb not in ALLOWED[la]:
            bad.append(f"{mods[a].relative_to(ROOT.parent)}:{line}: {a} imports {b}")
    assert not bad, "\n".join(bad)


def test_no_private_name_imported_across_modules(graph):
    mods, imports = graph
    bad = [f"{mods[a].relative_to(ROOT.parent)}:{line}: {name} from {b}"
           for a, b, name, line in imports
           if name and name.startswith("_") and not name.startswith("__") and b != a and b.startswith("archsim")]
    assert not bad, "\n".join(bad)


def _module_aliases(tree, package: str, mods: dict) -> dict[str, str]:
    """Local name -> the archsim module it is bound to by an import in the module ``tree``."""
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name in mods and a.asname:
                    out[a.asname] = a.name
        elif isinstance(node, ast.ImportFrom):
            target = _from_target(package, node)
            for a in node.names:
                if f"{target}.{a.name}" in mods:
                    out[a.asname or a.name] = f"{target}.{a.name}"
    return out


def test_no_private_name_used_through_a_module_alias(graph):
    """``X._name`` where X names another archsim module: a private reached without an import."""
    mods, _ = graph
    bad = []
    for mod, path in mods.items():
        tree = ast.parse(path.read_text())
        aliases = _module_aliases(tree, _package(mod, path), mods)
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases \
                    and aliases[node.value.id] != mod and node.attr.startswith("_") \
                    and not node.attr.startswith("__"):
                bad.append(f"{path.relative_to(ROOT.parent)}:{node.lineno}: {node.value.id}.{node.attr} "
                           f"({aliases[node.value.id]})")
    assert not bad, "\n".join(bad)


def test_matplotlib_only_in_report(graph):
    mods, imports = graph
    bad = [a for a, b, _, _ in imports if b.split(".")[0] == "matplotlib" and _layer(a) != "report"]
    assert not bad, bad
