"""Settings › Servers: the OpenAI-compatible servers whose models Nanoscope offers next to local
checkpoints (vLLM, SGLang, llama-server, transformers serve).

Each server has a name, a base URL, an optional API key (kept in the OS keyring, never in the
settings file), a stall timeout, and the names of models it serves without listing them. "Test"
asks the server for ``/v1/models`` on a background thread and shows what it found.
"""

from __future__ import annotations

import copy
from functools import partial
from typing import Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QDoubleSpinBox,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from desktop.config.keystore import KeyStore
from desktop.config.servers import new_server_id
from desktop.config.settings import Settings
from desktop.engine.remote.http import RemoteError, ServedModel, api_root, list_models
from desktop.qt.jobs.runner import Job, Run
from desktop.qt.widgets import common

DEFAULT_STALL_S = 30.0


class ServersDialog(QDialog):
    """Edits ``settings["servers"]`` and the keys in ``keys``; nothing is saved until OK.

    Signals:
        tested(int, object): a Test finished: its number and a list of ServedModel or an error line.
    """

    tested = Signal(int, object)

    def __init__(self, settings: Settings, keys: KeyStore, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Servers")
        self.setObjectName("ServersDialog")
        self.settings, self.keys = settings, keys
        self.servers: list[dict[str, Any]] = copy.deepcopy(settings.get("servers"))
        self.typed_keys: dict[str, str] = {}  # server id -> a key typed here, saved on OK
        self.removed: set[str] = set()
        self.session_note = ""  # set by accept(): why a key is kept for this session only
        self._test_number = 0
        self._job = Job("server-test", self, latest_wins=True)
        self.tested.connect(self._on_tested)

        self.list = QListWidget()
        self.list.setAccessibleName("Servers")
        self.list.setMinimumWidth(180)
        self.add_btn = QPushButton("Add")
        self.remove_btn = QPushButton("Remove")
        left = QVBoxLayout()
        left.addWidget(self.list, 1)
        buttons = QHBoxLayout()
        buttons.addWidget(self.add_btn)
        buttons.addWidget(self.remove_btn)
        left.addLayout(buttons)

        self.name_edit = QLineEdit()
        self.name_edit.setPlaceholderText("GPU box")
        self.url_edit = QLineEdit()
        self.url_edit.setPlaceholderText("http://127.0.0.1:8000  (an SSH tunnel keeps a remote server local)")
        self.key_edit = QLineEdit()
        self.key_edit.setEchoMode(QLineEdit.EchoMode.Password)
        self.stall_box = QDoubleSpinBox()
        self.stall_box.setRange(1.0, 3600.0)
        self.stall_box.setSuffix(" s")
        self.stall_box.setToolTip("How long a reply may pause before it counts as stalled")
        self.models_edit = QLineEdit()
        self.models_edit.setPlaceholderText("comma separated: models a server serves without listing them")
        for w, name in (
            (self.name_edit, "Server name"),
            (self.url_edit, "Server URL"),
            (self.key_edit, "API key"),
            (self.stall_box, "Stall timeout"),
            (self.models_edit, "Models not listed by the server"),
        ):
            w.setAccessibleName(name)
        form = QFormLayout()
        form.addRow("Name", self.name_edit)
        form.addRow("Base URL", self.url_edit)
        form.addRow("API key", self.key_edit)
        form.addRow("Stall timeout", self.stall_box)
        form.addRow("Other models", self.models_edit)
        self.keyring_note = QLabel(keys.problem)
        self.keyring_note.setObjectName("Muted")
        self.keyring_note.setWordWrap(True)
        self.keyring_note.setVisible(bool(keys.problem))
        self.test_btn = QPushButton("Test")
        self.test_btn.setToolTip("Ask the server for its models (GET /v1/models)")
        self.test_result = QLabel()
        self.test_result.setAccessibleName("Test result")
        self.test_result.setWordWrap(True)
        self.test_result.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        right = QVBoxLayout()
        right.addLayout(form)
        right.addWidget(self.keyring_note)
        test_row = QHBoxLayout()
        test_row.addWidget(self.test_btn)
        test_row.addWidget(self.test_result, 1)
        right.addLayout(test_row)
        right.addStretch(1)
        self.form = QWidget()
        self.form.setLayout(right)

        ok, cancel = QDialogButtonBox.StandardButton.Ok, QDialogButtonBox.StandardButton.Cancel
        self.button_box = QDialogButtonBox(ok | cancel)
        self.error = common.StatusLine()
        self.error.setObjectName("Error")
        row = QHBoxLayout()
        row.addLayout(left)
        row.addWidget(self.form, 1)
        outer = QVBoxLayout(self)
        outer.addLayout(row, 1)
        outer.addWidget(self.error)
        outer.addWidget(self.button_box)
        self.resize(720, 360)

        self.list.currentRowChanged.connect(self._show)
        self.add_btn.clicked.connect(self.add_server)
        self.remove_btn.clicked.connect(self.remove_server)
        self.test_btn.clicked.connect(self.test)
        self.button_box.accepted.connect(self.accept)
        self.button_box.rejected.connect(self.reject)
        for edit in (self.name_edit, self.url_edit, self.models_edit):
            edit.textEdited.connect(self._store_form)
        self.key_edit.textEdited.connect(self._store_key)
        self.stall_box.valueChanged.connect(self._store_form)
        self._refill(0)

    # ----- list ------------------------------------------------------------------------------

    def _refill(self, row: int) -> None:
        self.list.blockSignals(True)
        self.list.clear()
        for server in self.servers:
            self.list.addItem(server["name"] or server["url"] or "(new server)")
        self.list.blockSignals(False)
        self.form.setEnabled(bool(self.servers))
        self.remove_btn.setEnabled(bool(self.servers))
        if self.servers:
            self.list.setCurrentRow(min(max(row, 0), len(self.servers) - 1))
            self._show(self.list.currentRow())

    def current(self) -> dict[str, Any] | None:
        row = self.list.currentRow()
        return self.servers[row] if 0 <= row < len(self.servers) else None

    def add_server(self) -> None:
        server = {"id": new_server_id(self.servers), "name": "", "url": "", "stall_timeout": DEFAULT_STALL_S}
        server["models"] = []
        self.servers.append(server)
        self._refill(len(self.servers) - 1)
        self.url_edit.setFocus()

    def remove_server(self) -> None:
        row = self.list.currentRow()
        if 0 <= row < len(self.servers):
            server = self.servers.pop(row)
            self.removed.add(server["id"])
            self.typed_keys.pop(server["id"], None)
            self._refill(row)

    def _show(self, row: int) -> None:
        server = self.servers[row] if 0 <= row < len(self.servers) else None
        if server is None:
            return
        self.name_edit.setText(server["name"])
        self.url_edit.setText(server["url"])
        self.stall_box.blockSignals(True)
        self.stall_box.setValue(server["stall_timeout"])
        self.stall_box.blockSignals(False)
        self.models_edit.setText(", ".join(server["models"]))
        self.key_edit.setText(self.typed_keys.get(server["id"], ""))
        saved = server["id"] not in self.typed_keys and self.keys.get(server["id"])
        self.key_edit.setPlaceholderText(
            "a key is saved: type to replace it" if saved else "optional (kept in the OS keyring)"
        )
        self.test_result.setText("")

    def _store_form(self, *_args: object) -> None:
        server = self.current()
        if server is None:
            return
        server["name"] = self.name_edit.text().strip()
        server["url"] = self.url_edit.text().strip()
        server["stall_timeout"] = float(self.stall_box.value())
        server["models"] = [m.strip() for m in self.models_edit.text().split(",") if m.strip()]
        item = self.list.currentItem()
        if item is not None:
            item.setText(server["name"] or server["url"] or "(new server)")

    def _store_key(self, text: str) -> None:
        server = self.current()
        if server is not None:
            self.typed_keys[server["id"]] = text

    # ----- test ------------------------------------------------------------------------------

    def test(self) -> None:
        """List the current server's models on a background thread (``tested`` reports)."""
        server = self.current()
        if server is None:
            return
        try:
            url = api_root(server["url"])
        except RemoteError as exc:
            self.test_result.setText(f"⚠ {exc}")
            return
        key = self.typed_keys.get(server["id"]) or self.keys.get(server["id"])
        self._test_number += 1
        number = self._test_number
        self.test_result.setText(f"asking {url}/models …")
        self.test_btn.setEnabled(False)
        report = partial(self.tested.emit, number)
        self._job.start(partial(_models_of, url, key), done=report, failed=report)

    def _on_tested(self, number: int, outcome: object) -> None:
        if number != self._test_number:
            return  # an older test; a newer one is running
        self.test_btn.setEnabled(True)
        if isinstance(outcome, str):
            self.test_result.setText(f"⚠ {outcome}")
            return
        found: list[ServedModel] = list(outcome or [])  # type: ignore[call-overload]
        if not found:
            self.test_result.setText("The server answers but lists no models: name yours under Other models.")
            return
        shown = [m.name + (f" ({m.context_length:,} ctx)" if m.context_length else "") for m in found[:8]]
        more = f" and {len(found) - 8} more" if len(found) > 8 else ""
        self.test_result.setText(f"✓ {len(found)} model{'s' * (len(found) != 1)}: {', '.join(shown)}{more}")

    # ----- save ------------------------------------------------------------------------------

    def accept(self) -> None:
        """Validate, then save the list to settings and the keys to the key store."""
        for server in self.servers:
            try:
                api_root(server["url"])
            except RemoteError as exc:
                self.error.setText(f"{server['name'] or 'A server'}: {exc}")
                return
        try:
            self.settings.set("servers", self.servers)
        except ValueError as exc:
            self.error.setText(str(exc))
            return
        notes = []
        for sid in self.removed:
            self.keys.delete(sid)
        for sid, key in self.typed_keys.items():
            if key:
                note = self.keys.set(sid, key)
                if note:
                    notes.append(note)
        self.session_note = notes[0] if notes else ""
        self._job.close()  # a test still asking reports to nobody
        super().accept()

    def reject(self) -> None:
        self._job.close()
        super().reject()


def _models_of(url: str, key: str | None, _run: Run) -> list[ServedModel] | str:
    """On the test's thread: the models the server lists, or why it did not answer (one line)."""
    try:
        return list_models(url, key)
    except RemoteError as exc:
        return str(exc)
