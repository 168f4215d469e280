"""The shape of the code: no import cycles in desktop/, and a Qt-free core that imports nothing
from the rest of the app. Every import counts, including those inside functions."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

DESKTOP = Path(__file__).resolve().parents[1] / "desktop"
QT = ("PySide6", "shiboken6", "qasync", "superqt")


def module_name(path: Path) -> str:
    rel = path.relative_to(DESKTOP.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path) -> set[str]:
    """Every module ``path`` imports (absolute names), wherever the import statement stands."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            found.add(prefix)
            # "from . import x" may name a submodule
            found.update(f"{prefix}.{alias.name}" for alias in node.names)
    return found


def graph() -> dict[str, set[str]]:
    modules = {module_name(p): p for p in DESKTOP.rglob("*.py")}
    edges: dict[str, set[str]] = {}
    for name, path in modules.items():
        edges[name] = {m for m in imports_of(path) if m in modules and m != name}
    return edges


def test_desktop_has_no_import_cycles():
    edges = graph()
    # A package importing its own submodules from __init__ is how packages work, not a cycle.
    state: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                cycles.append([*stack[stack.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node)
    assert cycles == []


def test_the_engine_imports_nothing_from_the_app_and_nothing_from_qt():
    offenders = []
    for path in (DESKTOP / "engine").rglob("*.py"):
        for name in imports_of(path):
            top = name.split(".")[0]
            outside_engine = name.startswith("desktop.") and not name.startswith("desktop.engine")
            if outside_engine or name == "desktop" or top in QT:
                offenders.append((module_name(path), name))
    assert offenders == []


@functools.cache
def qt_modules() -> frozenset[str]:
    """Modules that import Qt themselves (parsed once per test run)."""
    return frozenset(
        module_name(p) for p in DESKTOP.rglob("*.py") if any(n.split(".")[0] in QT for n in imports_of(p))
    )


def qt_imports(paths: list[Path]) -> list[tuple[str, str]]:
    """(module, import) pairs where a module imports Qt."""
    return [(module_name(p), n) for p in paths for n in sorted(imports_of(p)) if n.split(".")[0] in QT]


def imports_under(paths: list[Path], package: str) -> list[tuple[str, str]]:
    """(module, import) pairs where a module imports from ``package``."""
    return [
        (module_name(p), n)
        for p in paths
        for n in sorted(imports_of(p))
        if n == package or n.startswith(package + ".")
    ]


def back_up_imports(paths: list[Path], qt: frozenset[str]) -> list[tuple[str, str]]:
    """(module, import) pairs where a Qt-free module imports a module of the Qt layer: Qt sits on
    top, so nothing under it may lean on it (the CLI starts the window, and only that)."""
    offenders = []
    for path in paths:
        name = module_name(path)
        if name in qt or name.startswith("desktop.cli"):
            continue
        offenders += [(name, n) for n in sorted(imports_of(path)) if n in qt]
    return offenders


def test_the_session_imports_no_qt():
    assert qt_imports(sorted((DESKTOP / "session").rglob("*.py"))) == []


def test_the_store_and_the_session_import_nothing_from_the_qt_package():
    paths = sorted((DESKTOP / "store").rglob("*.py")) + sorted((DESKTOP / "session").rglob("*.py"))
    assert imports_under(paths, "desktop.qt") == []


def test_no_qt_free_module_imports_a_qt_module():
    assert back_up_imports(sorted(DESKTOP.rglob("*.py")), qt_modules()) == []


def test_the_three_qt_rules_catch_a_violation():
    bad = DESKTOP / "session" / "_probe_violation.py"  # parsed, never imported
    try:
        bad.write_text("from PySide6.QtCore import QObject\n", encoding="utf-8")
        assert qt_imports([bad]) == [
            ("desktop.session._probe_violation", "PySide6.QtCore"),
            ("desktop.session._probe_violation", "PySide6.QtCore.QObject"),
        ]
        bad.write_text("from desktop.qt.widgets.palette import LIGHT\n", encoding="utf-8")
        assert imports_under([bad], "desktop.qt") == [
            ("desktop.session._probe_violation", "desktop.qt.widgets.palette"),
            ("desktop.session._probe_violation", "desktop.qt.widgets.palette.LIGHT"),
        ]
        bad.write_text("import json\nfrom desktop.qt.widgets.theme import colors\n", encoding="utf-8")
        assert back_up_imports([bad], qt_modules()) == [
            ("desktop.session._probe_violation", "desktop.qt.widgets.theme")
        ]
    finally:
        bad.unlink()


def test_qt_lives_in_one_package():
    """Every module that imports Qt is under desktop/qt/."""
    assert sorted(m for m in qt_modules() if not m.startswith("desktop.qt.")) == []


# Reads that are not of a user's file, each with the reason it may skip engine/files/bounded.py.
NOT_USER_FILES = {
    ("desktop/qt/app/desktop_entry.py", "read_text"): "the app's own launcher template, from its resources",
    ("desktop/qt/app/desktop_entry.py", "read_bytes"): "the app's own icons, from its resources",
    ("desktop/engine/kernels/machine.py", "open"): "/proc/cpuinfo, for the CPU's name",
    ("desktop/engine/bench.py", "read_text"): "/proc/self/status, for peak memory",
    ("desktop/engine/files/safe_json.py", "json.loads"): "the bounded parser itself",
    ("desktop/engine/remote/http.py", "json.loads"): "a server's reply, not a file",
    ("desktop/engine/remote/sse.py", "json.loads"): "a server's event, not a file",
    ("desktop/store/export.py", "json.loads"): "text of an export this app wrote (Infinity round-trips)",
}
READERS = frozenset({"read_text", "read_bytes"})
PARSERS = frozenset({"json.load", "json.loads", "tomllib.load", "tomllib.loads"})


def file_reads(path: Path) -> list[tuple[str, int]]:
    """(what, line) for each read of a file or parse of its text that bypasses engine/files/bounded.py:
    ``Path.read_text/read_bytes``, ``json``/``tomllib`` loads, and ``open()`` for reading."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Attribute):
            owner = func.value.id if isinstance(func.value, ast.Name) else ""
            if func.attr in READERS and owner != "bounded":
                found.append((func.attr, node.lineno))
            elif f"{owner}.{func.attr}" in PARSERS:
                found.append((f"{owner}.{func.attr}", node.lineno))
        elif isinstance(func, ast.Name) and func.id == "open":
            mode = (
                node.args[1]
                if len(node.args) > 1
                else next((k.value for k in node.keywords if k.arg == "mode"), None)
            )
            text = mode.value if isinstance(mode, ast.Constant) and isinstance(mode.value, str) else "r"
            if not set(text) & set("wax+"):
                found.append(("open", node.lineno))
    return found


def test_only_the_bounded_reader_reads_a_users_files():
    offenders = []
    for path in sorted(DESKTOP.rglob("*.py")):
        rel = str(path.relative_to(DESKTOP.parent))
        if rel == "desktop/engine/files/bounded.py":
            continue
        offenders += [
            f"{rel}:{line} {what}" for what, line in file_reads(path) if (rel, what) not in NOT_USER_FILES
        ]
    assert offenders == []


def test_the_file_read_rule_catches_a_violation(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import json, tomllib\nfrom pathlib import Path\n"
        "a = json.loads(Path('x').read_text())\nb = tomllib.load(open('t.toml', 'rb'))\n"
        "with open('out', 'w') as f:\n    pass\n",
        encoding="utf-8",
    )
    assert sorted(w for w, _ in file_reads(bad)) == ["json.loads", "open", "read_text", "tomllib.load"]


FAMILIES = ("nanochat", "hf", "kempnerforge", "remote")
SHARED = ("decode", "kernels", "files")  # what every family may use, and which uses no family
# Packages built on the families (a run's timeline and evals open any family's checkpoints):
# no family and no shared package may import them.
ABOVE_FAMILIES = ("runs", "export")


def package_of(name: str) -> str | None:
    """``desktop.engine.<package>`` for a module name below it, else None."""
    parts = name.split(".")
    return parts[2] if len(parts) > 3 and parts[:2] == ["desktop", "engine"] else None


def layering_violations(paths: list[Path]) -> list[tuple[str, str]]:
    """(module, import) pairs that break the engine's layering: a family importing another
    family, or shared code (decode, kernels, files) importing any family, or either importing
    what is built on the families (runs, export)."""
    found = []
    for path in paths:
        mine = package_of(module_name(path))
        for name in sorted(imports_of(path)):
            theirs = package_of(name)
            below = mine in FAMILIES or mine in SHARED
            if below and ((theirs in FAMILIES and theirs != mine) or theirs in ABOVE_FAMILIES):
                found.append((module_name(path), name))
    return found


def test_no_family_imports_another_and_shared_code_imports_none():
    assert layering_violations(sorted((DESKTOP / "engine").rglob("*.py"))) == []


def test_the_layering_rule_catches_a_violation(tmp_path):
    bad = DESKTOP / "engine" / "hf" / "_probe_violation.py"  # parsed, never imported
    try:
        bad.write_text("from desktop.engine.nanochat.model import GPT\n", encoding="utf-8")
        assert layering_violations([bad]) == [
            ("desktop.engine.hf._probe_violation", "desktop.engine.nanochat.model"),
            ("desktop.engine.hf._probe_violation", "desktop.engine.nanochat.model.GPT"),
        ]
        bad.write_text("from desktop.engine.runs import timeline\n", encoding="utf-8")
        assert layering_violations([bad]) == [
            ("desktop.engine.hf._probe_violation", "desktop.engine.runs.timeline"),
        ]
    finally:
        bad.unlink()


# What the widgets may know of the engine: the protocol and its value types, the checkpoint
# list, a run's timeline (values the Run tab draws), the served-model protocol's types (the
# Servers dialog), what the user does in the foreground (typing holds background compiles), and
# the one cleaner every line shown goes through.
UI_MAY_IMPORT = frozenset(
    f"desktop.engine.{m}"
    for m in (
        "backend",
        "params",
        "messages",
        "errors",
        "discovery",
        "runs.timeline",
        "remote.http",
        "foreground",
        "text_lines",
        "serve.records",
    )
)


def widget_violations(paths: list[Path]) -> list[tuple[str, str]]:
    """(module, import) pairs where a widget reaches past the engine's protocol types."""
    offenders = []
    for path in paths:
        for name in sorted(imports_of(path)):
            if name.startswith("desktop.engine") and not any(
                name == m or name.startswith(m + ".") for m in UI_MAY_IMPORT
            ):
                offenders.append((module_name(path), name))
    return offenders


# The Qt modules that run engine work (each on a model thread or a job), and so may reach past
# the protocol; every other Qt module is a view.
RUN_ENGINE_WORK = {
    "desktop.qt.model.worker": "opens a backend on the model thread",
    "desktop.qt.model.slot": "a KempnerForge run's remembered config",
    "desktop.qt.app.background": "folder scans and checkpoint summaries",
    "desktop.qt.app.hf_export_task": "the Hugging Face export",
    "desktop.qt.app.remeasure_task": "Settings › Re-measure kernels forgets the kept kernel choices",
    "desktop.qt.app.server_task": "File › Serve over the OpenAI API… runs the engine's server",
    "desktop.qt.app.smoke": "the smoke test finds the demo's steps",
    "desktop.qt.compare.memory_check": "the memory estimate of the picked checkpoints",
    "desktop.qt.run.report_task": "the report card",
    "desktop.qt.run.sweep_task": "the Run tab's evaluation sweeps",
}


def test_the_widgets_know_the_engine_only_through_its_protocol():
    views = [p for p in sorted((DESKTOP / "qt").rglob("*.py")) if module_name(p) not in RUN_ENGINE_WORK]
    assert widget_violations(views) == []


def test_the_widget_rule_catches_a_violation():
    bad = DESKTOP / "qt" / "chat" / "_probe_violation.py"  # parsed, never imported
    try:
        bad.write_text("from desktop.engine.runs.evals import sample_sweep\n", encoding="utf-8")
        assert widget_violations([bad]) == [
            ("desktop.qt.chat._probe_violation", "desktop.engine.runs.evals"),
            ("desktop.qt.chat._probe_violation", "desktop.engine.runs.evals.sample_sweep"),
        ]
    finally:
        bad.unlink()


def test_every_print_prints_a_line_the_one_cleaner_made():
    """``print(...)`` anywhere in desktop/ prints ``one_line(...)`` (the CLI's ``say`` is that
    print), so no name from a file reaches a terminal uncleaned (hardening round four, class 3)."""
    offenders = []
    for path in sorted(DESKTOP.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print":
                first = node.args[0] if node.args else None
                if not (isinstance(first, ast.Call) and getattr(first.func, "id", "") == "one_line"):
                    offenders.append(f"{module_name(path)}:{node.lineno}")
    assert offenders == []
