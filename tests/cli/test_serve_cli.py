"""``nanoscope serve`` as a user runs it: a real process that loads a golden checkpoint, says where
it serves on one line, answers an OpenAI client, and ends cleanly on Ctrl-C; what it cannot do
(a folder that is no checkpoint, a port in use, an address beyond this machine without a keyring)
is one line, exit 2 or a key made and shown once."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys

import httpx
import openai
import pytest
from support import REPO
from support.golden import GOLDEN

E7 = GOLDEN / "nanochat" / "E7"
TIMEOUT_S = 120


def serve(tmp_path, *args: str) -> subprocess.Popen:
    env = {**os.environ, "NANOCHAT_BASE_DIR": str(E7), "NANOSCOPE_API_KEY": ""}
    command = [sys.executable, "-m", "desktop", "--home", str(tmp_path / "home"), "serve", *args]
    return subprocess.Popen(
        command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def first_line(proc: subprocess.Popen) -> str:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        proc.wait(TIMEOUT_S)
        pytest.fail(f"serve printed nothing; stderr: {proc.stderr.read() if proc.stderr else ''}")
    return line.strip()


def test_serve_says_where_answers_a_client_and_ends_on_ctrl_c(tmp_path):
    proc = serve(tmp_path, "sft/d2", "--port", "0", "--device", "cpu")
    try:
        line = first_line(proc)
        assert line.startswith("serving sft/d2@20 (nanochat E7, float32) at http://127.0.0.1:")
        url = line.split(" at ")[1].split(" ")[0]
        client = openai.OpenAI(base_url=url, api_key="none", max_retries=0)
        assert [m.id for m in client.models.list().data] == ["sft/d2@20"]
        r = client.chat.completions.create(
            model="sft/d2@20", messages=[{"role": "user", "content": "hi"}], max_tokens=4, temperature=0
        )
        assert r.choices[0].message.content is not None
    finally:
        proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate(timeout=TIMEOUT_S)
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    with pytest.raises(httpx.TransportError):
        httpx.get(url.removesuffix("/v1") + "/health", timeout=5)


def one_error_line(proc: subprocess.Popen) -> str:
    out, err = proc.communicate(timeout=TIMEOUT_S)
    assert proc.returncode == 2, (out, err)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("nanoscope: error:"), err
    return lines[0]


def test_a_folder_that_is_no_checkpoint_is_one_line(tmp_path):
    (tmp_path / "empty").mkdir()
    assert "empty" in one_error_line(serve(tmp_path, str(tmp_path / "empty"), "--port", "0"))


def test_a_port_in_use_is_one_line(tmp_path):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    try:
        port = str(taken.getsockname()[1])
        line = one_error_line(serve(tmp_path, "sft/d2", "--port", port, "--device", "cpu"))
    finally:
        taken.close()
    assert f"cannot serve on 127.0.0.1:{port}" in line


def test_beyond_this_machine_a_key_is_required_made_once_and_asked_for(tmp_path):
    """Bound to every address, the server makes a key (shown once, kept in the keyring, or for this
    session where the machine has none) and refuses a request without it."""
    proc = serve(tmp_path, "sft/d2", "--host", "0.0.0.0", "--port", "0", "--device", "cpu")
    try:
        key_line = first_line(proc)
        assert key_line.startswith("a new API key for clients")
        key = key_line.rsplit(": ", 1)[1]
        line = first_line(proc)
        port = line.split(" at http://0.0.0.0:")[1].split("/")[0]
        root = f"http://127.0.0.1:{port}"
        assert httpx.get(f"{root}/v1/models", timeout=10).status_code == 401
        assert httpx.get(f"{root}/health", timeout=10).status_code == 200
        ok = httpx.get(f"{root}/v1/models", headers={"Authorization": f"Bearer {key}"}, timeout=10)
        assert ok.status_code == 200
    finally:
        proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate(timeout=TIMEOUT_S)
    assert proc.returncode == 0, err
    assert key not in err  # the key is shown once, on stdout, never in a warning or a log line
    logs = list((tmp_path / "home").rglob("*.log"))
    assert all(key not in p.read_text(errors="replace") for p in logs)
