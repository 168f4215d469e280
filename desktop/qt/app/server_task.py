"""Runs the engine's server (desktop/engine/serve/) for the window: the checkpoint opened on the
server's own model thread (a copy apart from Chat's), uvicorn on a job thread, every answered
request and every change of state recorded in the ServingSession on the GUI thread."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject

from desktop.config import paths
from desktop.config.keystore import SERVE_KEY_ID, serve_key
from desktop.config.settings import Settings
from desktop.engine.backend import LoadOptions
from desktop.engine.errors import NanoscopeError
from desktop.engine.kempnerforge.config import ConfigMemory
from desktop.qt.jobs.runner import Job, Run
from desktop.session.serving import ServeChoice, ServingSession

logger = logging.getLogger(__name__)


class ServerTask(QObject):
    """serve(choice) / stop(); the session says what happened."""

    def __init__(self, session: ServingSession, settings: Settings, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.session = session
        self.settings = settings
        self._job = Job("server", self)
        self._server: Any = None  # the engine's Server while it serves
        self._host: Any = None  # its ModelHost, from the start

    def serve(self, choice: ServeChoice) -> bool:
        """Start serving ``choice``; False while a server runs or stops already."""
        if self._job.running():
            return False
        self.session.starting(choice)
        return self._job.start(lambda run: self._run(run, choice), done=self._ended, failed=self._failed)

    def stop(self, wait: float = 30.0) -> None:
        server, host = self._server, self._host
        if server is not None:
            server.stop(wait)
        elif host is not None:
            host.stop(wait)
        self._job.stop(wait)

    def _run(self, run: Run, choice: ServeChoice) -> str:
        """On the job's thread: open, bind, serve until stopped. Returns why it ended ("")."""
        # Imported here: the server's libraries (uvicorn, starlette, openai's types) load only
        # when the user first serves, not with the window.
        from desktop.engine.registry import open_backend
        from desktop.engine.serve.app import ServeSettings, served_id
        from desktop.engine.serve.defaults import DEADLINE_S, MAX_WAITING, is_loopback
        from desktop.engine.serve.host import ModelHost
        from desktop.engine.serve.server import Server

        key, note = None, ""
        if not is_loopback(choice.host):
            key, made, problem = serve_key()
            note = f"clients must give the API key kept in the OS keyring as {SERVE_KEY_ID!r}"
            if made:  # shown once, here, so the user can give it to their clients
                note = f"a new API key for clients: {key} (kept in the OS keyring as {SERVE_KEY_ID!r})"
            if problem:
                note += f"; {problem}"
        # As Chat opens a checkpoint: the device the user set, a KempnerForge run's remembered TOML.
        options = LoadOptions(
            step=choice.step,
            device=self.settings.get("device"),
            dtype=choice.dtype,
            base_dir=paths.nanochat_base_dir(),
            config=ConfigMemory(paths.kempnerforge_configs_file()).get(Path(choice.path)),
            kernel_cache=paths.kernel_timings_file(),
        )
        self._host = host = ModelHost(lambda: open_backend(Path(choice.path), options), MAX_WAITING)
        host.start()
        while not host.opened(0.2):  # a load may take minutes; Stop ends the wait
            if run.stopped():
                host.stop()
                return ""
        try:
            info = host.wait_opened(0)
        except NanoscopeError as exc:
            host.stop()
            return str(exc)
        settings = ServeSettings(served_id(info), key, DEADLINE_S)
        try:
            server = Server(
                host, settings, choice.host, choice.port, lambda r: run.post(self.session.answered_request, r)
            )
        except NanoscopeError as exc:
            host.stop()
            return str(exc)
        self._server = server
        run.post(self.session.started, server.url, settings.model_id, note)
        server.run()  # until stop()
        self._server = self._host = None
        return ""

    def _ended(self, why: str) -> None:
        if why:
            self.session.failed(why)
        else:
            self.session.stopped()

    def _failed(self, error: str) -> None:
        self._server = self._host = None
        self.session.failed(error)
