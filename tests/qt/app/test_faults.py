"""Faults: out of memory, a worker that raises, a model deleted while loaded, kill -9 while streaming.

Each must end in a readable message (or intact data), never a crash or lost history.
"""

from __future__ import annotations

import shutil
import signal
import sqlite3
import subprocess
import sys
import textwrap

import pytest
from support import REPO, backend_helpers
from support.checkpoint_factory import default_config, write_checkpoint

from desktop.engine.backend import LoadOptions
from desktop.engine.decode.generation import GenerationStats
from desktop.engine.messages import Message
from desktop.engine.nanochat.backend import NanochatBackend
from desktop.engine.params import SamplingParams

ROOT = REPO


def test_out_of_memory_while_loading_is_one_clear_line(tmp_path):
    cfg = default_config("E7", n_embd=512, n_layer=4, vocab_size=8192)
    ckpt = write_checkpoint(tmp_path, "E7", phase="chatsft", cfg=cfg, dtype_mix="bf16_all", tokenizer="pkl")
    # Cap the process's data segment a little above what it uses once torch is imported and its
    # thread pool started: loading ~48 MB of bf16 weights (96 MB as float32) cannot fit.
    code = textwrap.dedent(f"""
        import re, resource, sys
        import torch, torch._dynamo  # import everything first: imports under the cap fail differently
        from desktop.cli.main import main
        torch.ones(256, 256) @ torch.ones(256, 256)
        used = int(re.search(r"VmData:\\s+(\\d+) kB", open("/proc/self/status").read()).group(1)) * 1024
        resource.setrlimit(resource.RLIMIT_DATA, (used + (40 << 20), resource.RLIM_INFINITY))
        sys.exit(main(["generate", {str(ckpt)!r}, "--prompt", "hi", "--max-tokens", "2"]))
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 2
    lines = [ln for ln in r.stderr.splitlines() if ln.strip() and "Warning" not in ln]
    assert len(lines) == 1 and lines[0].startswith("nanoscope: error:")
    assert "out of memory" in lines[0] and "Traceback" not in r.stderr


def test_model_deleted_from_disk_while_loaded_keeps_generating(tmp_path):
    ckpt = write_checkpoint(tmp_path, "E7", phase="chatsft", tokenizer="pkl")
    session = NanochatBackend.open(ckpt, LoadOptions(device="cpu"))
    shutil.rmtree(tmp_path / "chatsft_checkpoints")
    stats = GenerationStats()
    ids = list(session.render([Message.of_text("user", "hello")], 8).ids)
    list(backend_helpers.stream(session, ids, SamplingParams(temperature=0.0, max_tokens=8), stats=stats))
    assert stats.new_tokens > 0  # the weights are memory-mapped: the open file outlives the directory


@pytest.mark.gui
def test_worker_raising_mid_generation_shows_the_error_and_keeps_working(qtbot, tmp_path, monkeypatch):
    from desktop.engine.decode import generation
    from desktop.qt.app.app import build

    ckpt = write_checkpoint(tmp_path, "E7", phase="chatsft", tokenizer="pkl")
    window = build()
    qtbot.addWidget(window)
    window.show()
    with qtbot.waitSignal(window.controller.model_loaded, timeout=60000):
        window.controller.load_checkpoint(ckpt, 10)
    real = generation.sample_next
    calls = {"n": 0}

    def flaky(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 4:
            raise RuntimeError("simulated kernel failure")
        return real(*args, **kwargs)

    monkeypatch.setattr(generation, "sample_next", flaky)
    with qtbot.waitSignal(window.controller.reply_finished, timeout=60000) as done:
        assert window.controller.send("first", SamplingParams(temperature=0.0, max_tokens=20))
    assert done.args[0]["error"] == "RuntimeError: simulated kernel failure"
    assert not window.banner.isHidden() and "simulated kernel failure" in window.banner.message.text()
    reply_id, reply = window.controller.path[-1]
    stored = dict(window.controller.store.active_path(window.controller.conv_id))[reply_id]
    assert stored.meta["error"] and stored.parts == reply.parts  # the partial reply is kept
    with qtbot.waitSignal(window.controller.reply_finished, timeout=60000) as done:
        assert window.controller.send("second", SamplingParams(temperature=0.0, max_tokens=5))
    assert "error" not in done.args[0] and done.args[0]["new_tokens"] > 0
    window.close()


def test_kill_9_while_streaming_leaves_the_history_intact(tmp_path):
    # A large vocab makes a random model's stop tokens rare, so the reply streams for seconds.
    cfg = default_config("E7", sequence_len=512, vocab_size=4096)
    ckpt = write_checkpoint(tmp_path, "E7", phase="chatsft", cfg=cfg, tokenizer="pkl")
    home = tmp_path / "home"
    script = textwrap.dedent(f"""
        import os, sys
        os.environ["QT_QPA_PLATFORM"] = "offscreen"
        from pathlib import Path
        from PySide6.QtCore import QTimer
        from PySide6.QtWidgets import QApplication
        from desktop.config import paths
        paths.set_home({str(home)!r})
        app = QApplication([])
        from desktop.qt.app.app import build
        window = build()
        c = window.controller
        from desktop.engine.params import SamplingParams
        def on_loaded(info):
            c.send("tell me everything", SamplingParams(temperature=1.0, max_tokens=100000, seed=5))
        def poll():
            if c.conv_id is None:
                return
            path = c.store.active_path(c.conv_id)
            if len(path) == 2 and path[-1][1].parts and not c.store.is_complete(path[-1][0]):
                print("FLUSHED", c.conv_id, flush=True)
        c.model_loaded.connect(on_loaded)
        timer = QTimer(); timer.timeout.connect(poll); timer.start(100)
        c.load_checkpoint(Path({str(ckpt)!r}), 10)
        app.exec()
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        line = proc.stdout.readline()  # blocks until the reply has been written at least once
        assert line.startswith("FLUSHED"), line
        conv_id = int(line.split()[1])
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        proc.stdout.close()
    from desktop.store import HistoryStore

    db = home / "data" / "history.sqlite3"
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    store = HistoryStore(db)
    path = store.active_path(conv_id)
    assert [m.role for _, m in path] == ["user", "assistant"]
    assert path[0][1].plain_text() == "tell me everything"
    assert path[1][1].parts and not store.is_complete(path[1][0])  # partial, flushed, marked incomplete
    store.close()
