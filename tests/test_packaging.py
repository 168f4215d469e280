"""Packaging: the Linux launcher entry, the generated icons, the .icns container, the PyInstaller
spec, the smoke-test checker, the wheel and setup.sh. Nothing here touches the real home folder;
only the slow wheel test builds anything (in a temporary folder)."""

from __future__ import annotations

import ast
import configparser
import importlib.util
import os
import shutil
import site
import struct
import subprocess
import sys
import xml.etree.ElementTree as ET
import zipfile
from pathlib import Path

import pytest

from desktop.config.paths import resource_path
from desktop.engine.errors import NanoscopeError
from desktop.qt.app import desktop_entry

ROOT = Path(__file__).resolve().parents[1]
ICONS = ROOT / "resources" / "icons"
SPEC = ROOT / "packaging" / "nanoscope.spec"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

# Apple's PNG-capable icns element types and the pixel size each must hold.
ICNS_SIZES = {b"icp4": 16, b"icp5": 32, b"icp6": 64, b"ic07": 128, b"ic08": 256, b"ic09": 512, b"ic10": 1024}

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="XDG launchers are Linux-only")


def png_size(data: bytes) -> tuple[int, int]:
    """(width, height) from a PNG's IHDR chunk, which the spec requires to come first."""
    assert data[:8] == PNG_SIGNATURE
    length, kind = struct.unpack(">I4s", data[8:16])
    assert kind == b"IHDR" and length == 13
    return struct.unpack(">II", data[16:24])


def read_desktop_file(path: Path) -> dict[str, str]:
    parser = configparser.ConfigParser(interpolation=None, strict=True)
    parser.optionxform = str  # keys are case-sensitive in desktop entries
    parser.read_string(path.read_text(encoding="utf-8"))
    assert parser.sections() == ["Desktop Entry"]
    return dict(parser["Desktop Entry"])


def unquote_exec(value: str) -> list[str]:
    r"""Read an Exec value the way the Desktop Entry spec describes, independently of the writer.

    First the string-type escapes (``\\`` is one backslash), then arguments split on spaces,
    where a double-quoted argument may contain backslash-escaped ``"`$\``; ``%%`` is a literal %.
    """
    text = value.replace("\\\\", "\0").replace("\\s", " ").replace("\0", "\\")
    args, current, quoted, started, i = [], "", False, False, 0
    while i < len(text):
        c = text[i]
        if quoted and c == "\\" and i + 1 < len(text) and text[i + 1] in '"`$\\':
            current, i = current + text[i + 1], i + 2
            continue
        if c == '"':
            quoted, started = not quoted, True
        elif c == " " and not quoted:
            if started:
                args.append(current)
            current, started = "", False
        else:
            current, started = current + c, True
        i += 1
    assert not quoted, f"unterminated quote in {value!r}"
    if started:
        args.append(current)
    return [a.replace("%%", "%") for a in args]


# --- icons -------------------------------------------------------------------------------------


@pytest.mark.parametrize("size", [16, 32, 48, 64, 128, 256, 512, 1024])
def test_png_icon_has_its_pixel_size(size):
    path = ICONS / f"nanoscope-{size}.png"
    assert png_size(path.read_bytes()) == (size, size)


def test_icns_holds_one_valid_png_per_entry_at_the_size_its_type_promises():
    data = (ICONS / "nanoscope.icns").read_bytes()
    magic, total = struct.unpack(">4sI", data[:8])
    assert magic == b"icns" and total == len(data)
    seen = {}
    offset = 8
    while offset < len(data):
        kind, length = struct.unpack(">4sI", data[offset : offset + 8])
        assert length > 8 and offset + length <= len(data), f"entry {kind!r} overruns the file"
        seen[kind] = png_size(data[offset + 8 : offset + length])
        offset += length
    assert offset == len(data)
    assert seen == {kind: (n, n) for kind, n in ICNS_SIZES.items()}


def test_svg_icon_is_a_square_svg_document():
    svg = ET.parse(ICONS / "nanoscope.svg").getroot()
    assert svg.tag.endswith("svg")
    x, y, w, h = (float(v) for v in svg.get("viewBox").split())
    assert (x, y) == (0, 0) and w == h > 0


def test_icons_are_reachable_through_resource_path():
    assert resource_path("icons/nanoscope-256.png").read_bytes() == (ICONS / "nanoscope-256.png").read_bytes()


# --- desktop entry -----------------------------------------------------------------------------


@linux_only
def test_install_writes_launcher_and_icons_under_xdg_data_home(tmp_path, monkeypatch):
    data_home = tmp_path / "xdg-data"
    fake_home = tmp_path / "home"
    monkeypatch.setenv("XDG_DATA_HOME", str(data_home))
    monkeypatch.setenv("HOME", str(fake_home))

    written = desktop_entry.install_desktop_entry()

    launcher = data_home / "applications" / "nanoscope.desktop"
    assert written[0] == launcher
    assert all(p.is_relative_to(data_home) and p.is_file() for p in written)
    assert not fake_home.exists()
    for n in desktop_entry.ICON_SIZES:
        icon = data_home / "icons" / "hicolor" / f"{n}x{n}" / "apps" / "nanoscope.png"
        assert icon in written
        assert png_size(icon.read_bytes()) == (n, n)
    svg = data_home / "icons" / "hicolor" / "scalable" / "apps" / "nanoscope.svg"
    assert svg.read_bytes() == (ICONS / "nanoscope.svg").read_bytes()

    entry = read_desktop_file(launcher)
    assert entry["Type"] == "Application"
    assert entry["Name"] == "Nanoscope"
    assert entry["Terminal"] == "false"
    assert entry["Categories"] == "Development;Science;"
    assert entry["StartupWMClass"] == "nanoscope"
    assert entry["Icon"] == "nanoscope"
    assert "@" not in "".join(entry.values()), "a template placeholder was left unfilled"
    argv = unquote_exec(entry["Exec"])
    assert Path(argv[0]).is_file()
    assert Path(entry["TryExec"]).is_file()


@linux_only
def test_explicit_dirs_win_over_xdg_data_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "unused"))
    written = desktop_entry.install_desktop_entry(tmp_path / "apps", tmp_path / "icons")
    assert written[0] == tmp_path / "apps" / "nanoscope.desktop"
    assert (tmp_path / "icons" / "hicolor" / "48x48" / "apps" / "nanoscope.png") in written
    assert not (tmp_path / "unused").exists()


def test_relative_xdg_data_home_is_ignored_as_the_spec_says(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_DATA_HOME", "relative/path")
    assert desktop_entry.xdg_data_home() == tmp_path / ".local" / "share"


def test_launcher_runs_the_venv_console_script_next_to_the_interpreter(tmp_path, monkeypatch):
    bindir = tmp_path / "my venv" / "bin"
    bindir.mkdir(parents=True)
    (bindir / "python").write_text("")
    (bindir / "nanoscope").write_text("")
    monkeypatch.setattr(sys, "executable", str(bindir / "python"))
    monkeypatch.delattr(sys, "frozen", raising=False)
    argv, try_exec, workdir = desktop_entry.launch_command()
    assert argv == [str(bindir / "nanoscope")] and try_exec == bindir / "nanoscope" and workdir is None


def test_frozen_launcher_runs_the_frozen_executable(tmp_path, monkeypatch):
    exe = tmp_path / "dist" / "nanoscope" / "nanoscope"
    monkeypatch.setattr(sys, "executable", str(exe))
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    assert desktop_entry.launch_command() == ([str(exe)], exe, None)


def test_checkout_without_console_script_runs_the_module_from_the_checkout(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python3"))
    monkeypatch.delattr(sys, "frozen", raising=False)
    argv, try_exec, workdir = desktop_entry.launch_command()
    assert argv == [str(tmp_path / "python3"), "-m", "desktop"]
    assert (workdir / "desktop" / "qt" / "app" / "desktop_entry.py").is_file()
    text = desktop_entry.render_desktop_file(argv, try_exec, workdir)
    assert f"\nPath={workdir}\n" in text


@pytest.mark.parametrize(
    "arg",
    ["/opt/nanoscope/nanoscope", "/home/a b/bin/nanoscope", 'q"uote', "dollar$HOME", "back\\slash", "50%"],
)
def test_exec_arguments_survive_quoting(arg):
    assert unquote_exec(desktop_entry.exec_quote(arg)) == [arg]


def test_a_path_with_spaces_is_double_quoted():
    assert desktop_entry.exec_quote("/a b/nanoscope") == '"/a b/nanoscope"'


def test_desktop_entry_module_needs_neither_qt_nor_torch():
    code = (
        "import sys, desktop.qt.app.desktop_entry; "
        "print(sorted(m for m in ('PySide6', 'torch') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"


@linux_only
def test_missing_icons_are_reported_before_anything_is_written(tmp_path, monkeypatch):
    monkeypatch.setattr(desktop_entry, "resource_path", lambda name: tmp_path / "nowhere" / name)
    with pytest.raises(NanoscopeError, match="icon missing"):
        desktop_entry.install_desktop_entry(tmp_path / "apps", tmp_path / "icons")
    assert not (tmp_path / "apps").exists()


# --- PyInstaller spec and smoke test -----------------------------------------------------------


def _spec_tree() -> ast.Module:
    return ast.parse(SPEC.read_text(encoding="utf-8"), filename=str(SPEC))


def test_spec_is_python_and_bundles_resources():
    tree = _spec_tree()
    resources_strings = [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value == "resources"
    ]
    assert resources_strings, "the spec never names the resources folder"
    calls = {
        node.func.id: node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
    }
    assert {"Analysis", "PYZ", "EXE", "COLLECT", "BUNDLE"} <= set(calls)
    analysis_kw = {kw.arg: kw.value for kw in calls["Analysis"].keywords}
    assert isinstance(analysis_kw["datas"], ast.Name) and analysis_kw["datas"].id == "datas"
    collect_name = next(kw.value.value for kw in calls["COLLECT"].keywords if kw.arg == "name")
    assert collect_name == "nanoscope"
    exe_kw = {kw.arg: kw.value for kw in calls["EXE"].keywords}
    assert ast.literal_eval(exe_kw["exclude_binaries"]) is True


def test_spec_resource_datas_lists_every_file_under_resources():
    """Run the spec's own resource_datas() and compare with a walk of resources/."""
    tree = _spec_tree()
    func = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "resource_datas")
    namespace = {"ROOT": ROOT}
    exec(compile(ast.Module([func], type_ignores=[]), str(SPEC), "exec"), namespace)
    datas = namespace["resource_datas"]()
    expected = {
        (str(p), str(p.parent.relative_to(ROOT)))
        for p in (ROOT / "resources").rglob("*")
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(ROOT).parts)
    }
    assert set(datas) == expected
    assert (str(ICONS / "nanoscope.icns"), "resources/icons") in datas


def _load_smoke_module(monkeypatch):
    """packaging/ is not a package: load the script by path (registered, as dataclasses need)."""
    spec = importlib.util.spec_from_file_location("smoke_test", ROOT / "packaging" / "smoke_test.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "smoke_test", module)
    spec.loader.exec_module(module)
    return module


def test_smoke_checker_accepts_a_clean_run_and_names_each_problem(monkeypatch):
    smoke = _load_smoke_module(monkeypatch)
    good = smoke.SmokeResult(
        0,
        "SMOKE OK python:12*7 | python_output:84 | text:84.\n",
        "smoke test: loading /x\nThis plugin does not support propagateSizeHints()\n",
    )
    assert good.problems() == []
    bad = smoke.SmokeResult(1, "SMOKE FAIL timed out\n", "Traceback (most recent call last):\n")
    problems = bad.problems()
    assert any("exit code 1" in p for p in problems)
    assert any("SMOKE FAIL" in p for p in problems)
    assert any("Traceback" in p for p in problems)
    wrong = smoke.SmokeResult(0, "SMOKE OK text:85\n", "")
    assert wrong.problems() == ["reply does not contain '84': 'SMOKE OK text:85'"]


@pytest.mark.slow
def test_smoke_test_passes_against_the_source_tree():
    proc = subprocess.run(
        [sys.executable, str(ROOT / "packaging" / "smoke_test.py"), "--timeout", "120"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("smoke_test: PASS")


# --- the wheel: `pip install .` must work outside the source tree -------------------------------


def _pyproject() -> dict:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+; the check is the same on every version
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def test_pyproject_lists_every_package_and_maps_resources():
    """The package list is explicit (find cannot see the mapped resources folder), so a new
    subpackage must be added there by hand; this names the one that was forgotten."""
    config = _pyproject()["tool"]["setuptools"]
    on_disk = {
        ".".join(init.parent.relative_to(ROOT).parts) for init in (ROOT / "desktop").rglob("__init__.py")
    }
    assert on_disk - set(config["packages"]) == set(), "add these to [tool.setuptools] packages"
    assert "desktop.resources" in config["packages"]
    assert config["package-dir"] == {"desktop.resources": "resources"}
    assert config["package-data"]["desktop.resources"] == ["**/*"]  # by pattern: the demo's steps change


def test_both_commands_start_through_the_cli():
    project = _pyproject()["project"]
    assert (
        project["scripts"]["nanoscope"] == project["gui-scripts"]["nanoscope-gui"] == "desktop.cli.main:main"
    )


def _copy_sources(dest: Path) -> Path:
    """The checkout without venvs, caches and build output, so the build sees only sources
    (and never writes build/ or *.egg-info into the shared tree)."""
    ignore = shutil.ignore_patterns(".*", "__pycache__", "build", "dist", "*.egg-info")
    return Path(shutil.copytree(ROOT, dest, ignore=ignore))


def _site_packages(python: Path) -> Path:
    code = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True).stdout
    return Path(out.strip())


@pytest.mark.slow
def test_the_installed_wheel_runs_the_demo_from_outside_the_source_tree(tmp_path, monkeypatch):
    """Build the wheel, install it into a fresh venv, run `nanoscope --smoke-test` elsewhere."""
    src = _copy_sources(tmp_path / "src")
    wheels = tmp_path / "wheels"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]
    build = [*pip, "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q", "-w", wheels, src]
    subprocess.run(build, check=True, capture_output=True, cwd=tmp_path)
    (wheel,) = wheels.glob("nanoscope-*.whl")

    names = set(zipfile.ZipFile(wheel).namelist())
    resources = {
        "desktop/resources/" + p.relative_to(ROOT / "resources").as_posix()
        for p in (ROOT / "resources").rglob("*")
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(ROOT).parts)
    }
    assert resources - names == set(), "resources/ files missing from the wheel"
    assert {"desktop/py.typed", "desktop/cli/main.py"} <= names

    # A fresh venv without pip. torch and Qt are not installed again: a .pth file adds this
    # environment's site-packages after the venv's own (a venv's --system-site-packages would
    # only reach the base interpreter's). Folders named in a .pth get no .pth processing of
    # their own, so the checkout's editable install stays out of the way.
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True)
    bindir = venv / ("Scripts" if sys.platform == "win32" else "bin")
    site_packages = _site_packages(bindir / "python")
    (site_packages / "parent-env.pth").write_text("\n".join(site.getsitepackages()) + "\n", encoding="utf-8")
    install = [*pip, "--python", bindir / "python", "install", "--no-deps", "--no-index", "-q"]
    subprocess.run([*install, "--ignore-installed", wheel], check=True, capture_output=True, cwd=tmp_path)

    smoke = _load_smoke_module(monkeypatch)
    outside, home = tmp_path / "elsewhere", tmp_path / "home"
    outside.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "NANOSCOPE_HOME")}
    env.update(QT_QPA_PLATFORM="offscreen", PYTHONUNBUFFERED="1")
    proc = subprocess.run(
        [bindir / "nanoscope", "--home", home, "--smoke-test"],
        cwd=outside,
        env=env,
        capture_output=True,
        text=True,
        errors="replace",
        timeout=smoke.DEFAULT_TIMEOUT_S,
        check=False,
    )
    result = smoke.SmokeResult(proc.returncode, proc.stdout, proc.stderr)
    assert result.problems() == [], proc.stdout + proc.stderr
    installed_demo = site_packages / "desktop" / "resources" / "demo" / "chatsft_checkpoints" / "demo"
    assert f"smoke test: loading {installed_demo}\n" in proc.stderr  # the wheel's copy, not the checkout's
    db = home / "data" / "history.sqlite3"
    assert db.is_file() and not db.with_name(db.name + "-wal").exists()  # the store was closed at quit
    assert any(bindir.glob("nanoscope-gui*"))


# --- setup.sh: reinstall only when needed ------------------------------------------------------

# Stands in for .venv/bin/python: records each call. torch is "there", and `desktop` resolves to
# this checkout unless STUB_DESKTOP_ELSEWHERE=1 (the `-I` check).
STUB_PYTHON = """#!/bin/sh
echo "$*" >>"$STUB_LOG"
if [ "$1" = -I ]; then exit "${STUB_DESKTOP_ELSEWHERE:-0}"; fi
exit 0
"""


@pytest.mark.skipif(sys.platform == "win32", reason="setup.sh is for Linux and macOS")
def test_setup_sh_reinstalls_only_when_pyproject_changes_or_the_checkout_moved(tmp_path):
    repo = tmp_path / "repo"
    (repo / "packaging").mkdir(parents=True)
    shutil.copy(ROOT / "packaging" / "setup.sh", repo / "packaging")
    shutil.copy(ROOT / "pyproject.toml", repo)
    bindir = repo / ".venv" / "bin"
    bindir.mkdir(parents=True)
    for name in ("python", "nanoscope"):
        (bindir / name).write_text(STUB_PYTHON)
        (bindir / name).chmod(0o755)
    log = tmp_path / "calls.log"

    def installs(mode: str, **env: str) -> list[str]:
        """The `pip install` calls one `setup.sh <mode>` made."""
        log.write_text("")
        environ = {k: v for k, v in os.environ.items() if k != "DISPLAY"}
        environ.update(STUB_LOG=str(log), **env)
        subprocess.run(["bash", str(repo / "packaging" / "setup.sh"), mode], env=environ, check=True)
        return [line for line in log.read_text().splitlines() if line.startswith("-m pip install")]

    assert installs("test") == ["-m pip install -q -e .[test]"]
    assert installs("test") == []
    assert installs("run") == []  # the test extras include everything `run` needs
    pyproject = repo / "pyproject.toml"
    text = pyproject.read_text()
    pyproject.write_text(text.replace("dependencies = [", 'dependencies = [\n    "rich>=13",', 1))
    assert pyproject.read_text() != text  # a dependency was added
    assert installs("run") == ["-m pip install -q -e ."]
    assert installs("run") == []
    assert installs("test") == ["-m pip install -q -e .[test]"]
    assert installs("run", STUB_DESKTOP_ELSEWHERE="1") == ["-m pip install -q -e ."]
