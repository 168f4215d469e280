"""Driving the real window in tests: build it as the app does, quit and restart it, and the
user's common actions (send, regenerate, click a history row, open a folder). The fixtures that
hold the windows are in ``tests/qt/conftest.py``."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtGui import QAction
from PySide6.QtWidgets import QFileDialog

from desktop.config.settings import Settings
from desktop.qt.app.app import build, shutdown
from desktop.qt.app.background import Background
from desktop.qt.app.main_window import MainWindow
from desktop.qt.app.settings_autosave import SettingsAutosave
from desktop.qt.chat.controller import ChatController
from desktop.qt.compare.controller import CompareController
from desktop.qt.model.slot import ModelSlot
from desktop.store import HistoryStore
from support.fake_backend import open_fake

WAIT = 30000


def open_window(qtbot, fake: bool = True) -> MainWindow:
    """The app as ``qt.app.app.build`` makes it; with ``fake`` the chat's model is the fake backend."""
    if fake:
        settings = Settings()
        store = HistoryStore()
        controller = ChatController(store, settings, ModelSlot(settings, opener=open_fake))
        win = MainWindow(controller, Background(store), settings, CompareController(store, settings))
        SettingsAutosave(settings, parent=win)
    else:
        win = build()
    qtbot.addWidget(win)
    win.show()
    return win


def restart(qtbot, windows: list[MainWindow], fake: bool = True) -> MainWindow:
    """Quit the app the way the user does, then start it again on the same settings and history."""
    shutdown(windows[-1])
    windows.append(open_window(qtbot, fake))
    return windows[-1]


def action(win: MainWindow, text: str) -> QAction:
    return next(a for a in win.findChildren(QAction) if a.text() == text)


def load_fake(qtbot, win: MainWindow, name: str = "m", step: int = 7) -> None:
    with qtbot.waitSignal(win.controller.model_loaded, timeout=WAIT):
        win.controller.load_checkpoint(Path("/fake") / name, step)


def send(qtbot, win: MainWindow, text: str) -> dict:
    """Type ``text`` and press Enter; the reply's stats once it is done."""
    with qtbot.waitSignal(win.controller.reply_finished, timeout=WAIT) as done:
        win.input.editor.setPlainText(text)
        qtbot.keyClick(win.input.editor, Qt.Key.Key_Return)
    return done.args[0]


def regenerate(qtbot, win: MainWindow) -> dict:
    """Ctrl+R."""
    with qtbot.waitSignal(win.controller.reply_finished, timeout=WAIT) as done:
        action(win, "Regenerate last reply").trigger()
    return done.args[0]


def click_row(qtbot, win: MainWindow, conv_id: int, double: bool = False) -> None:
    lst = win.sidebar.list
    row = next(i for i in range(lst.count()) if lst.item(i).data(Qt.ItemDataRole.UserRole) == conv_id)
    center = lst.visualItemRect(lst.item(row)).center()
    click = qtbot.mouseDClick if double else qtbot.mouseClick
    click(lst.viewport(), Qt.MouseButton.LeftButton, pos=center)


def open_folder(qtbot, win: MainWindow, folder: Path, monkeypatch) -> None:
    """File › Open checkpoint folder…, the user choosing ``folder`` in the system's dialog."""
    monkeypatch.setattr(QFileDialog, "getExistingDirectory", lambda *_args, **_kw: str(folder))
    with qtbot.waitSignal(win.background.folder_opened, timeout=WAIT):
        qtbot.mouseClick(win.picker.open_btn, Qt.MouseButton.LeftButton)


def start_with_base(qtbot, windows, monkeypatch, base: Path, fake: bool = True) -> MainWindow:
    """Start the app with a nanochat base dir: the first scan lists it and the newest loads."""
    monkeypatch.setenv("NANOCHAT_BASE_DIR", str(base))
    win = open_window(qtbot, fake)
    windows.append(win)
    with qtbot.waitSignal(win.controller.model_loaded, timeout=WAIT):
        win.start()
    return win


def banner_says(win: MainWindow, title: str) -> bool:
    return not win.banner.isHidden() and win.banner.title.text() == title
