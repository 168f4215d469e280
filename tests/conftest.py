"""Shared test setup: offscreen Qt, isolated app folders, and a guard against leaked threads.

Every test runs with NANOSCOPE_HOME in its own tmp folder and NANOCHAT_BASE_DIR pointing at an
empty one, so nothing reads or writes the developer's real settings, history or checkpoints.

"spec §N" in the tests cites the team's checkpoint-format spec (shared/specs/checkpoint-formats.md,
outside this repo); docs/ARCHITECTURE.md summarises what the app relies on.
"""

from __future__ import annotations

import getpass
import os
import tempfile

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
# Inductor's cache where it is by default (under the system's temporary folder), not in each
# test's home as the app keeps it (compiled_draft.keep_compiled_code_in): the tests that compile
# with inductor find the code of earlier runs (~25 s instead of minutes).
os.environ.setdefault(
    "TORCHINDUCTOR_CACHE_DIR", os.path.join(tempfile.gettempdir(), f"torchinductor_{getpass.getuser()}")
)
# Likewise the native kernels (kernels/native.py): built once per machine, not in each test's home.
os.environ.setdefault(
    "NANOSCOPE_NATIVE_DIR", os.path.join(tempfile.gettempdir(), f"nanoscope_native_{getpass.getuser()}")
)
# The README's command runs the suite on one pytest-xdist worker per CPU. Each worker's torch takes
# its share of the CPUs for intra-op threads (before torch is imported, which reads it once): N
# workers of N threads each on N cores spend the cores switching between threads that wait on
# each other. Tests that ask for a thread count (StreamOptions.threads) still get it.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // _WORKERS)))


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path, monkeypatch):
    from desktop.config import paths

    monkeypatch.setenv("NANOSCOPE_HOME", str(tmp_path / "nanoscope-home"))
    monkeypatch.setenv("NANOCHAT_BASE_DIR", str(tmp_path / "no-nanochat-here"))
    paths.set_home(None)
    yield
    paths.set_home(None)


@pytest.fixture(autouse=True)
def _no_draft_compiles(monkeypatch):
    """The app compiles a draft checkpoint in the background by default: a minute of both cores
    that would slow every later test and the kernel timings they take. The tests of it ask."""
    from desktop.config import settings

    monkeypatch.setitem(settings.DEFAULTS, "compile_drafts", False)


@pytest.fixture
def several_threads():
    """At least two intra-op threads for the test (restored after): a product is split across
    threads, and its route timed and listed, only where there are threads to split it across; an
    xdist worker, or a one-CPU machine, may run with one."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(max(2, before))
    yield
    torch.set_num_threads(before)


@pytest.fixture(autouse=True)
def _compiles_at_the_tests_priority(request, monkeypatch):
    """The app's background compiles lower their thread to the lowest OS priority
    (engine/foreground.py). Beside another xdist worker's test at normal priority, such a thread
    gets a sliver of a core, and a test that waits on a compile (a minute or two alone) takes many.
    The tests of that priority are marked ``compile_priority`` and keep it."""
    if request.node.get_closest_marker("compile_priority"):
        return
    from desktop.engine.decode import compiled_draft

    monkeypatch.setattr(compiled_draft, "lower_this_threads_priority", lambda: False)


@pytest.fixture(autouse=True)
def _no_leaked_qthreads(request):
    """Fail a GUI test that leaves a QThread running: it would crash a later test."""
    if "qtbot" not in request.fixturenames:
        yield
        return
    from PySide6.QtCore import QThread

    started: list[QThread] = []
    original = QThread.start

    def tracking_start(self, *args, **kwargs):
        started.append(self)
        return original(self, *args, **kwargs)

    QThread.start = tracking_start
    try:
        yield
    finally:
        QThread.start = original
    running = [t for t in started if _is_running(t)]
    for thread in running:  # stop them so the failure does not also crash the next test
        thread.quit()
        thread.wait(5000)
    names = [t.objectName() or repr(t) for t in running]
    assert not running, f"QThreads still running after the test: {names}"


def _is_running(thread) -> bool:
    try:
        return thread.isRunning()
    except RuntimeError:  # the C++ object was deleted (deleteLater after finished): not running
        return False


@pytest.fixture(autouse=True)
def _collect_qt_garbage_here(request):
    """Collect the cycles a GUI test leaves behind on the GUI thread, where Qt objects must die.

    Left to the cyclic collector, a window or widget of this test could be freed later on
    whatever thread allocates at that moment (a summary in the executor, a worker), and Qt warns
    that its timers "cannot be stopped from another thread" in some later, unrelated test.
    """
    yield
    if "qtbot" in request.fixturenames or "qapp" in request.fixturenames:
        import gc

        gc.collect()
