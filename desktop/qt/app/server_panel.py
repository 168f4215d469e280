"""File › Serve over the OpenAI API…: the Server panel, a view over the ServingSession.

Pick a checkpoint (Chat's model, or any local one the picker lists), a precision and an address,
switch Serve on: the panel shows the address with a Copy button, how clients get the key when one is
needed, and every request as it is answered. Every label comes from the session, which the task
fills in from what actually ran.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QApplication,
    QComboBox,
    QDialog,
    QFormLayout,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QPushButton,
    QSpinBox,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from desktop.engine.backend import ModelInfo
from desktop.engine.serve.records import RequestRecord
from desktop.qt.app.server_task import ServerTask
from desktop.session.serving import LOADING, MAX_REQUESTS, SERVING, ServeChoice, ServingSession

COLUMNS = ("Time", "Client", "Request", "Status", "Prompt", "Reply", "Seconds", "Note")
PRECISIONS = (
    ("Auto (the device's default)", "auto"),
    ("Exact (float32)", "float32"),
    ("Fast", "fast"),
    ("int8", "int8"),
)
ABOUT = (
    "Serve a checkpoint over the OpenAI API: editors, Open WebUI, scripts and lm-evaluation-harness "
    "talk to it as to any OpenAI-compatible server. It runs its own copy of the model, apart from Chat's."
)


class ServerPanel(QDialog):
    def __init__(
        self,
        session: ServingSession,
        task: ServerTask,
        entries: Callable[[], list],
        chat_model: Callable[[], ModelInfo | None],
        parent: QWidget | None = None,
    ) -> None:
        super().__init__(parent)
        self.setWindowTitle("Server")
        self.setObjectName("ServerPanel")
        self.session, self.task = session, task
        self._entries, self._chat_model = entries, chat_model
        self.resize(820, 520)

        about = QLabel(ABOUT)
        about.setWordWrap(True)
        about.setObjectName("Muted")
        self.checkpoint = QComboBox()
        self.step = QComboBox()
        self.checkpoint.currentIndexChanged.connect(self._show_steps)
        self.precision = QComboBox()
        for label, value in PRECISIONS:
            self.precision.addItem(label, value)
        self.host = QLineEdit("127.0.0.1")
        self.host.setToolTip("127.0.0.1 serves this machine only; any other address needs an API key")
        self.port = QSpinBox()
        self.port.setRange(0, 65535)
        self.port.setSpecialValueText("any free")  # 0: the system picks; the address says which
        self.port.setValue(8000)
        where = QHBoxLayout()
        where.addWidget(self.host, 1)
        where.addWidget(QLabel("Port"))
        where.addWidget(self.port)
        form = QFormLayout()
        form.addRow("Checkpoint", self.checkpoint)
        form.addRow("Step", self.step)
        form.addRow("Precision", self.precision)
        form.addRow("Address", where)

        self.switch = QPushButton("Serve")
        self.switch.setCheckable(True)
        self.switch.setObjectName("Primary")
        self.switch.clicked.connect(self._on_switch)
        self.status = QLabel()
        self.status.setWordWrap(True)
        switch_row = QHBoxLayout()
        switch_row.addWidget(self.switch)
        switch_row.addWidget(self.status, 1)

        self.url = QLineEdit()
        self.url.setReadOnly(True)
        self.url.setPlaceholderText("the address appears here once serving")
        self.copy_btn = QPushButton("Copy")
        self.copy_btn.setToolTip("Copy the base URL for an OpenAI client (base_url)")
        self.copy_btn.clicked.connect(lambda: QApplication.clipboard().setText(self.url.text()))
        url_row = QHBoxLayout()
        url_row.addWidget(QLabel("Base URL"))
        url_row.addWidget(self.url, 1)
        url_row.addWidget(self.copy_btn)
        self.key_note = QLabel()
        self.key_note.setWordWrap(True)
        self.key_note.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)

        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setHorizontalHeaderLabels(COLUMNS)
        self.table.verticalHeader().setVisible(False)
        self.table.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        self.table.horizontalHeader().setStretchLastSection(True)

        layout = QVBoxLayout(self)
        layout.addWidget(about)
        layout.addLayout(form)
        layout.addLayout(switch_row)
        layout.addLayout(url_row)
        layout.addWidget(self.key_note)
        layout.addWidget(QLabel("Requests"))
        layout.addWidget(self.table, 1)

        session.events.changed.connect(self.show_state)
        session.events.request.connect(self._add_row)
        self.refresh_checkpoints()
        for record in session.requests:
            self._add_row(record)
        self.show_state()

    def refresh_checkpoints(self) -> None:
        """Chat's model first (where one is loaded, at its step), then every local checkpoint, whose
        steps the Step list offers (the latest first)."""
        self.checkpoint.clear()
        info = self._chat_model()
        if info is not None and info.family != "remote":
            self.checkpoint.addItem(f"Chat's model: {info.name}", (info.path, (info.step,)))
        for entry in self._entries():
            if entry.source == "remote" or not entry.steps:
                continue
            self.checkpoint.addItem(f"{entry.source}/{entry.tag}", (str(entry.path), tuple(entry.steps)))
        self._show_steps()

    def _show_steps(self) -> None:
        self.step.clear()
        data = self.checkpoint.currentData()
        for step in reversed(data[1] if data else ()):
            self.step.addItem("latest" if step is None else f"step {step:,}", step)

    def choice(self) -> ServeChoice | None:
        data = self.checkpoint.currentData()
        if data is None:
            return None
        step = self.step.currentData()
        name = self.checkpoint.currentText().removeprefix("Chat's model: ")
        label = name if name != self.checkpoint.currentText() or step is None else f"{name} · step {step:,}"
        return ServeChoice(
            str(data[0]),
            step,
            label,
            self.precision.currentData(),
            self.host.text().strip(),
            self.port.value(),
        )

    def _on_switch(self, on: bool) -> None:
        if on:
            choice = self.choice()
            if choice is None:
                self.session.failed("no checkpoint to serve: open or pick one first")
                return
            self.task.serve(choice)
        else:
            self.task.stop()
        self.show_state()

    def show_state(self) -> None:
        s = self.session
        self.switch.setChecked(s.on)
        self.switch.setText("Stop serving" if s.on else "Serve")
        for w in (self.checkpoint, self.step, self.precision, self.host, self.port):
            w.setEnabled(not s.on)
        self.status.setText(s.status_line())
        self.url.setText(s.url if s.state == SERVING else "")
        self.copy_btn.setEnabled(s.state == SERVING)
        self.key_note.setText(s.key_note)
        self.key_note.setVisible(bool(s.key_note))
        if s.state == LOADING:
            self.url.setPlaceholderText("loading the model…")

    def _add_row(self, record: RequestRecord) -> None:
        row = self.table.rowCount()
        self.table.insertRow(row)
        values = (
            time.strftime("%H:%M:%S"),
            record.client,
            f"{record.method} {record.path}",
            str(record.status),
            str(record.prompt_tokens or ""),
            str(record.completion_tokens or ""),
            f"{record.seconds:.2f}",
            record.note,
        )
        for column, value in enumerate(values):
            item = QTableWidgetItem(value)
            if column == 3 and record.status >= 400:
                item.setForeground(Qt.GlobalColor.red)
            self.table.setItem(row, column, item)
        while self.table.rowCount() > MAX_REQUESTS:  # as many as the session keeps
            self.table.removeRow(0)
        self.table.scrollToBottom()
        self.status.setText(self.session.status_line())
