"""The package's public face: every exported name resolves, and importing it stays cheap."""

from __future__ import annotations

import subprocess
import sys

import raybatch


def test_every_public_name_resolves_to_its_object() -> None:
    for name in raybatch.__all__:
        assert getattr(raybatch, name) is not None, name
    assert sorted(raybatch.__all__) == dir(raybatch)


def test_all_lists_exactly_the_names_of_the_lazy_export_table() -> None:
    table = {name for names in raybatch.EXPORTS.values() for name in names}
    assert sorted(raybatch.__all__) == sorted(table)
    assert {"RaybatchSearcher", "CappingScheduler", "trainable", "Metric"} <= table
    assert len(table) <= 30  # a small face: the rest lives at its defining module


def test_every_public_name_is_the_object_of_its_defining_module() -> None:
    """One address per name: the public name is the defining module's own object, and the
    name is defined there (not re-exported from elsewhere)."""
    import importlib

    for module, names in raybatch.EXPORTS.items():
        defining = importlib.import_module(f"raybatch.{module}")
        for name in names:
            value = getattr(defining, name)
            assert getattr(raybatch, name) is value, name
            if hasattr(value, "__module__") and not isinstance(value, str):
                assert value.__module__ == defining.__name__, (name, value.__module__)


def test_import_and_the_trial_reporter_load_no_heavy_dependency() -> None:
    """Each trial is a fresh Ray worker: what it imports is paid once per trial."""
    code = (
        "import sys, raybatch; from raybatch.trial.reporting import TrialReporter;"
        "print(sorted(m for m in ('torch', 'ray', 'optuna', 'pydantic', 'yaml',"
        " 'raybatch.space.search_space') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_every_public_class_says_how_it_is_used() -> None:
    """What an engineer reads first, in an IDE or ``help()``: every public class (the errors
    aside) opens with a one-sentence summary, then says what it takes (``Args:`` or
    ``Attributes:``) and shows its use (``Example::``)."""
    import inspect

    checked, lacking = [], {}
    for name in raybatch.__all__:
        value = getattr(raybatch, name)
        if not inspect.isclass(value) or issubclass(value, BaseException):
            continue
        checked.append(name)
        lines = inspect.cleandoc(value.__doc__ or "").splitlines() or [""]
        first, sections = lines[0], {line.strip() for line in lines}
        problems = [
            why
            for why, ok in (
                ("summary", first.endswith(".") and ". " not in first),
                ("summary on one line", len(lines) == 1 or not lines[1].strip()),
                ("Args: or Attributes:", bool(sections & {"Args:", "Attributes:"})),
                ("Example::", bool(sections & {"Example::", "Example:"})),
            )
            if not ok
        ]
        if problems:
            lacking[name] = problems
    assert {"BestConfig", "RaybatchSearcher", "SearchSpace", "Workload"} <= set(checked)
    assert lacking == {}


def test_an_unknown_name_is_an_attribute_error() -> None:
    try:
        raybatch.no_such_thing  # noqa: B018
    except AttributeError as exc:
        assert "no_such_thing" in str(exc)
    else:
        raise AssertionError("expected AttributeError")


def _module_graph() -> dict[str, set[str]]:
    """``raybatch`` module -> the ``raybatch`` modules it imports (anywhere in its body).

    The package's own ``__init__`` (the lazy public face, which names every module) is left
    out; ``from raybatch.x import y`` counts as an import of ``raybatch.x.y`` when that is a
    module, else of ``raybatch.x``.
    """
    import ast
    from pathlib import Path

    root = Path(raybatch.__file__).parent
    names = {}
    for path in root.rglob("*.py"):
        parts = path.relative_to(root.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        names[name] = path
    graph: dict[str, set[str]] = {}
    for name, path in names.items():
        if name == "raybatch":
            continue
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                edges |= {a.name for a in node.names if a.name in names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    edges.add(full if full in names else node.module)
        graph[name] = {e for e in edges if e in names and e not in ("raybatch", name)}
    return graph


def test_no_module_imports_itself_back_through_others() -> None:
    """The data flows one way: no chain of imports (lazy ones included) leads back."""
    graph = _module_graph()
    state: dict[str, str] = {}  # "open" while on the current path, "done" once explored
    cycles: list[list[str]] = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                cycles.append([*path[path.index(nxt) :], node, nxt] if nxt in path else [node, nxt])
            elif nxt not in state:
                visit(nxt, [*path, node])
        state[node] = "done"

    for start in sorted(graph):
        if start not in state:
            visit(start, [])
    assert cycles == [], cycles[:3]


def test_the_rows_the_report_and_the_exports_lie_below_the_tuning_and_the_run() -> None:
    """``raybatch.results`` (rows, selection), the report and the exports (``export``,
    ``formats``) never import ``raybatch.tuning`` or ``raybatch.run``, not even inside a
    function: the search and the run import
    them, and a finished run's files are read back and exported without the machinery that
    wrote them."""
    graph = _module_graph()
    sides = ("raybatch.results", "raybatch.formats", "raybatch.report", "raybatch.export")
    below = [m for m in graph if m.startswith(sides)]
    assert {"raybatch.results.rows", "raybatch.report", "raybatch.export"} <= set(below)
    assert "raybatch.formats.hf" in below
    above = ("raybatch.tuning", "raybatch.run")
    upward = {m: sorted(e for e in graph[m] if e.startswith(above)) for m in below}
    assert {m: e for m, e in upward.items() if e} == {}


def test_no_two_classes_of_the_package_share_a_name() -> None:
    """One name, one thing: a reader (or a traceback, or a pickle) never has to ask which
    ``Measured`` or ``MemoryBudget`` is meant."""
    import ast
    from collections import defaultdict
    from pathlib import Path

    root = Path(raybatch.__file__).parent
    where: dict[str, list[str]] = defaultdict(list)
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                where[node.name].append(str(path.relative_to(root)))
    assert {name: paths for name, paths in where.items() if len(paths) > 1} == {}


def test_no_module_is_over_500_lines() -> None:
    from pathlib import Path

    root = Path(raybatch.__file__).parent
    long = {
        str(p.relative_to(root)): n
        for p in root.rglob("*.py")
        if (n := len(p.read_text().splitlines())) > 500
    }
    assert long == {}


def test_every_module_docstring_is_at_most_20_lines_and_cites_what_the_repository_has() -> None:
    """A module's docstring says what it is for and why, in a screen: history, timings and the
    whole argument belong in ``docs/`` (a long one goes unread). Every ``docs/`` page a module
    cites exists, and none cites a design file the repository does not ship."""
    import ast
    import re
    from pathlib import Path

    root = Path(raybatch.__file__).parent
    long, missing = {}, {}
    for p in root.rglob("*.py"):
        text = p.read_text()
        doc = ast.get_docstring(ast.parse(text), clean=False) or ""
        if (n := len(doc.splitlines())) > 20:
            long[str(p.relative_to(root))] = n
        cited = {*re.findall(r"docs/[\w-]+\.md", text), *re.findall(r"\bDESIGN\.md", text)}
        absent = sorted(c for c in cited if not (root.parent / c).exists())
        if absent:
            missing[str(p.relative_to(root))] = absent
    assert long == {} and missing == {}


def _sources() -> dict[str, str]:
    """``path -> source`` of every Python file of the package and of ``bench/``."""
    from pathlib import Path

    root = Path(raybatch.__file__).parent
    files = [*root.rglob("*.py"), *(root.parent / "bench").glob("*.py")]
    return {str(p.relative_to(root.parent)): p.read_text() for p in files}


def test_no_function_is_over_80_lines() -> None:
    import ast

    long = {
        f"{path}:{node.name}": n
        for path, source in _sources().items()
        if path.startswith("raybatch")
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and (n := (node.end_lineno or node.lineno) - node.lineno + 1) > 80
    }
    assert long == {}


def test_no_private_name_is_imported_from_another_module() -> None:
    """A leading underscore means "this module's own": nobody else leans on it (bench too)."""
    import ast

    leaning = [
        f"{path}: {node.module}.{alias.name}"
        for path, source in _sources().items()
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("raybatch")
        for alias in node.names
        if alias.name.startswith("_") and not alias.name.endswith("__")  # __version__ is public
    ]
    assert leaning == []


def test_every_package_init_is_only_its_docstring() -> None:
    """One mechanism for a public face (the top-level lazy table): a sub-package's
    ``__init__`` re-exports nothing, so every other name has one address, its module's."""
    import ast
    from pathlib import Path

    root = Path(raybatch.__file__).parent
    for init in root.rglob("__init__.py"):
        if init.parent == root:
            continue
        body = ast.parse(init.read_text()).body
        assert len(body) == 1 and isinstance(body[0], ast.Expr), init  # the docstring alone


def test_every_import_inside_a_function_says_why_it_is_deferred() -> None:
    """An import inside a function is either of a third-party package whose deferral
    ``raybatch._lazy.DEFERRED_IMPORTS`` explains (PyTorch, Ray, Optuna, the optional
    dependencies), or says why on its line or the comment line above its block; anything else
    (the standard library, a light module of the package) is imported at the top."""
    import ast

    from raybatch._lazy import DEFERRED_IMPORTS

    unexplained = []
    for path, source in _sources().items():
        if not path.startswith("raybatch"):
            continue
        lines = source.splitlines()
        for fn in ast.walk(ast.parse(source)):
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(fn):
                if not isinstance(node, ast.Import | ast.ImportFrom):
                    continue
                module = node.module if isinstance(node, ast.ImportFrom) else node.names[0].name
                if (module or "").split(".")[0] in DEFERRED_IMPORTS:
                    continue
                above = node.lineno - 2  # the block's first import, then the line above it
                while above >= 0 and lines[above].strip().startswith(("import ", "from ")):
                    above -= 1
                if "#" not in lines[node.lineno - 1] and not lines[above].strip().startswith("#"):
                    unexplained.append(f"{path}:{node.lineno} {module}")
    assert unexplained == []


LAYERS: tuple[tuple[str, ...], ...] = (
    ("raybatch.errors", "raybatch.keys", "raybatch._lazy", "raybatch.shipping"),
    ("raybatch.version", "raybatch.status", "raybatch.metric", "raybatch.provenance",
     "raybatch.space"),
    ("raybatch.workload", "raybatch.batches"),
    ("raybatch.memory", "raybatch.formats", "raybatch.adapters", "raybatch.examples"),
    ("raybatch.cluster",),
    ("raybatch.export",),
    ("raybatch.results",),
    ("raybatch.timemodel", "raybatch.report"),
    ("raybatch.trial",),
    ("raybatch.tuning",),
    ("raybatch.run",),
    ("raybatch.cli", "raybatch.__main__"),
)  # fmt: skip
"""The rooms from the ground up (``docs/layout.md`` is the map): a room imports only rooms on
its own floor or below, so each can be read, tested and shipped without those above it."""


def _layer(module: str) -> int:
    for floor, rooms in enumerate(LAYERS):
        if any(module == r or module.startswith(f"{r}.") for r in rooms):
            return floor
    raise AssertionError(f"{module} stands in no layer: give it a floor in LAYERS")


def test_the_layout_names_every_module_in_its_room() -> None:
    """``docs/layout.md`` is the map a maintainer reads first: every module of a room is named
    in that room's entry (a module left out is a room nobody finds)."""
    from pathlib import Path

    package = Path(raybatch.__file__).parent
    layout = (package.parent / "docs" / "layout.md").read_text()
    entries = {e.split("`", 2)[1].rstrip("/"): e for e in layout.split("\n- ")[1:] if "`" in e}
    missing = []
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package).parts
        if path.name == "__init__.py" or parts[0] in ("examples", "_search_spaces"):
            continue
        where = layout if len(parts) == 1 else entries.get(parts[0], "")
        if f"`{path.name}`" not in where:
            missing.append("/".join(parts))
    assert missing == [], f"docs/layout.md does not name: {missing}"


def test_every_import_runs_down_the_layers_or_along_one() -> None:
    """No arrow runs back up, lazy imports and ``TYPE_CHECKING`` ones included; and no module
    below the command line leans on the package's face (``import raybatch``)."""
    graph = _module_graph()
    upward = sorted(
        f"{a} -> {b}" for a, edges in graph.items() for b in edges if _layer(b) > _layer(a)
    )
    assert upward == []
    import ast

    face = [
        path
        for path, source in _sources().items()
        if path.startswith("raybatch/") and not path.startswith(("raybatch/cli/", "raybatch/ex"))
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Import) and any(a.name == "raybatch" for a in node.names)
    ]  # fmt: skip
    assert face == []
