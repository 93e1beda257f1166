"""The shape of the house, held against the code: imports run one way (no circle among the
modules of agents/, dashboard/ and api/, deferred imports counted), no module over 700 lines, no class
over 350, neither dashboard/ nor api/ is ever imported by agents/, api/ never imports dashboard/
(the two meet in the project shell, shiftlog/), and the core never imports a feature (fleets,
schedules, rewinds: they reach it through agents/hooks.py). See docs/architecture.md."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.no_services

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("agents", "dashboard", "api", "shiftlog")
MAX_MODULE_LINES = 700
MAX_CLASS_LINES = 350


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "migrations" in path.parts:
                continue
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def type_only(tree: ast.Module) -> set[ast.AST]:
    """Nodes under `if TYPE_CHECKING:`: imports for annotations, never executed."""
    skipped: set[ast.AST] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                skipped.update(ast.walk(child))
    return skipped


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The project modules `name` imports, at the top or inside functions alike (imports for
    type annotations only, under `if TYPE_CHECKING:`, are not executed and do not count)."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    skipped = type_only(tree)
    found = set()
    for node in ast.walk(tree):
        if node in skipped:
            continue
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
                base = f"{base}.{node.module}" if node.module else base
            # `from pkg import mod` imports the module pkg.mod; `from pkg import name`, a name
            # defined in pkg/__init__.py.
            targets = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
                for alias in node.names
            ]
        for target in targets:
            # The longest known module the name lies in: `from agents import x` may name the
            # module agents.x or a name defined in agents/__init__.py.
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {name: imports_of(name, path, known) for name, path in mods.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
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
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_the_cycle_finder_finds_a_cycle():  # a positive control for the test below
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_imports_run_one_way():
    edges = graph()
    assert len(edges) > 40  # the walk found the project
    assert cycles(edges) == []


def test_the_domain_never_imports_the_dashboard():
    edges = graph()
    wrong = {
        m: sorted(t for t in ts if t.startswith(("dashboard", "api")))
        for m, ts in edges.items()
        if m.startswith("agents")
    }
    assert {m: ts for m, ts in wrong.items() if m.startswith("agents") and ts} == {}


def under(module: str, packages: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def crossings(
    edges: dict[str, set[str]], importers: tuple[str, ...], imported: tuple[str, ...]
) -> list[tuple[str, str]]:
    """(a, b) for every import by a module under `importers` of a module under `imported`."""
    return sorted(
        (m, t)
        for m, ts in edges.items()
        if under(m, importers)
        for t in ts
        if under(t, imported) and not under(t, importers)
    )


def test_the_crossing_finder_finds_a_crossing():  # a positive control for the tests below
    edges = {"api.x": {"dashboard.y", "agents.z"}, "dashboard.y": {"agents.z"}, "agents.z": set()}
    assert crossings(edges, ("api",), ("dashboard",)) == [("api.x", "dashboard.y")]
    assert crossings(edges, ("dashboard",), ("api",)) == []
    assert not under("dashboards.y", ("dashboard",))


def test_the_api_never_imports_the_dashboard():
    # What both need (who sees what, streamed downloads) lives below both, in agents/.
    assert crossings(graph(), ("api",), ("dashboard",)) == []


def test_the_apps_meet_only_in_the_project_shell():
    # The dashboard's urls name no API view: shiftlog/urls.py puts the two side by side, and
    # nothing of the apps imports the project shell (settings are read through django.conf).
    edges = graph()
    assert crossings(edges, ("dashboard",), ("api",)) == []
    assert crossings(edges, ("agents", "api", "dashboard"), ("shiftlog",)) == []
    assert "api.main" in edges["shiftlog.urls"]


# --- features as packages (agents/hooks.py) ---------------------------------------------------
FEATURES = ("agents.fleets", "agents.schedules", "agents.rewinds")
# What puts the house together may name every feature: the app's ready() (it registers the
# features' hooks), the tasks, the admin, the management commands.
ROOTS = ("agents.apps", "agents.tasks", "agents.admin", "agents.management")
# The core's imports of a feature that remain, each for a reason; the list only shrinks.
KNOWN = {
    # The reaper asks again for rewinds whose task was lost.
    ("agents.reaper", "agents.rewinds"),
}


def core_imports_of_features(
    edges: dict[str, set[str]], known=frozenset()
) -> list[tuple[str, str]]:
    """(core module, feature module) for every import of a feature by the core: the modules of
    agents/ that are neither a feature's nor one of the ROOTS."""
    return sorted(
        (m, t)
        for m, ts in edges.items()
        if under(m, ("agents",)) and not under(m, FEATURES + ROOTS)
        for t in ts
        if under(t, FEATURES) and (m, t) not in known
    )


def test_every_known_exception_is_still_there():  # the list only shrinks: a gone one is struck
    assert set(core_imports_of_features(graph())) >= KNOWN


def test_the_feature_rule_finds_a_core_import_of_a_feature():  # a positive control
    edges = {
        "agents.lifecycle": {"agents.fleets.cascade", "agents.hooks"},
        "agents.fleets.cascade": {"agents.lifecycle", "agents.hooks"},
        "agents.apps": {"agents.fleets.cascade"},
        "agents.hooks": set(),
    }
    assert core_imports_of_features(edges) == [("agents.lifecycle", "agents.fleets.cascade")]


def test_the_core_never_imports_a_feature():
    # The status machine, checkpoints and services call hooks; features register with them.
    edges = graph()
    assert core_imports_of_features(edges, KNOWN) == []
    for module in ("agents.lifecycle", "agents.services", "agents.rewinds"):
        assert "agents.hooks" in edges[module], module  # the core's side: it calls the hooks


def test_features_import_only_the_core_and_themselves():
    edges = graph()
    wrong = [
        (m, t)
        for feature in FEATURES
        for m, t in crossings(edges, (feature,), tuple(f for f in FEATURES if f != feature))
    ]
    assert wrong == []
    assert all(any(under(m, (f,)) for m in edges) for f in FEATURES)  # the features are there


def test_the_features_register_their_hooks():
    from agents import hooks
    from agents.fleets import cascade, parent

    assert cascade.status_changed in hooks.status_changed._functions
    assert cascade.cascade in hooks.controlled._functions
    assert cascade.rewound in hooks.rewound._functions
    assert parent.Fleet in hooks.slice_part._functions


def test_no_module_or_class_is_too_big():
    too_big = []
    for name, path in modules().items():
        text = path.read_text()
        lines = text.count("\n") + 1
        if lines > MAX_MODULE_LINES:
            too_big.append(f"module {name}: {lines} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef):
                size = node.end_lineno - node.lineno + 1
                if size > MAX_CLASS_LINES:
                    too_big.append(f"class {name}.{node.name}: {size} lines")
    assert too_big == []


# --- one writer per attribute of a slice (agents/runtime/slice.py: OWNERS) ---------------------
RUNTIME = ROOT / "agents" / "runtime"
SLICE_NAMES = {"s", "self.s", "self.slice", "h.s", "slice"}


def slice_writes(source: str, module: str) -> list[tuple[str, str, int]]:
    """(module, attribute, line) for every assignment to an attribute of a slice: `s.x = ...`,
    `s.x += ...`, `s.x.update(...)` / `.clear()` / `[k] = ...`, and in slice.py `self.x = ...`
    inside class Slice."""
    tree = ast.parse(source)
    names = set(SLICE_NAMES)
    found = []

    def base_attr(node: ast.AST) -> tuple[str, str] | None:
        if isinstance(node, ast.Subscript):
            node = node.value
        if isinstance(node, ast.Attribute):
            return ast.unparse(node.value), node.attr
        return None

    for cls in ast.walk(tree):
        in_slice = isinstance(cls, ast.ClassDef) and cls.name == "Slice" and module == "slice"
        scope = cls if in_slice else tree
        if not in_slice and cls is not tree:
            continue
        for node in ast.walk(scope):
            targets: list[ast.AST] = []
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
                targets = [node.target]
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in {"update", "clear", "pop", "setdefault", "append"}
            ):
                targets = [node.func.value]
            for target in targets:
                found_attr = base_attr(target)
                if found_attr is None:
                    continue
                base, attr = found_attr
                if base in names or (in_slice and base == "self"):
                    found.append(("slice" if in_slice else module, attr, node.lineno))
    return found


def test_every_attribute_of_a_slice_has_one_writer():
    from agents.runtime.slice import OWNERS

    init = ast.parse((RUNTIME / "slice.py").read_text())
    slice_class = next(
        n for n in ast.walk(init) if isinstance(n, ast.ClassDef) and n.name == "Slice"
    )
    ctor = next(n for n in slice_class.body if getattr(n, "name", "") == "__init__")
    fixed = {
        t.attr
        for n in ast.walk(ctor)
        if isinstance(n, (ast.Assign, ast.AnnAssign))
        for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
        if isinstance(t, ast.Attribute)
    } - set(OWNERS)
    wrong = []
    ctor_lines = set(range(ctor.lineno, ctor.end_lineno + 1))
    for path in sorted(RUNTIME.glob("*.py")):
        module = path.stem
        for where, attr, line in slice_writes(path.read_text(), module):
            if module == "slice" and line in ctor_lines:
                continue  # __init__ sets every attribute's first value
            owner = OWNERS.get(attr)
            if owner != where:
                wrong.append(f"{path.name}:{line} assigns {attr} (owner: {owner or 'fixed'})")
    assert wrong == []
    assert "run" in fixed and "session" not in fixed


def test_the_writer_rule_finds_a_second_writer():  # a positive control for the test above
    source = "def f(s):\n    s.approvals = {}\n    s.conv.add(1)\n    s.rules.append(2)\n"
    assert slice_writes(source, "gate") == [("gate", "approvals", 2), ("gate", "rules", 4)]
