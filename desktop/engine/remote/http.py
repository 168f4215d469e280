"""HTTP for OpenAI-compatible servers: base URLs, headers, the model list, and one readable line
for every way a request can fail (Qt-free).

Every message names the server by host and port only: never a header, so never the API key (a
server that echoes the key back has it replaced before the text goes anywhere).
"""

from __future__ import annotations

import json
import logging
import re
import ssl
from dataclasses import dataclass
from typing import Any

import httpx

from desktop.engine.errors import NanoscopeError
from desktop.engine.files.safe_json import JsonRefused, loads_bounded
from desktop.engine.remote.steps import StepRunner, TimedOut
from desktop.engine.text_lines import one_line

logger = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 10.0
LIST_TIMEOUT_S = 15.0  # for the whole of GET /v1/models, not per read (docs/SERVING.md)
MAX_MODELS_BYTES = 8 << 20  # vLLM's answer for one model is ~1 KB
MAX_MODELS = 10_000
MESSAGE_CHARS = 240
# Fields of /v1/models entries that carry the context length: vLLM, SGLang, LM Studio, others.
SHA256_HEX = re.compile(r"[0-9a-f]{64}")
CONTEXT_FIELDS = ("max_model_len", "context_length", "max_context_length", "context_window", "n_ctx")


class RemoteError(NanoscopeError):
    """A served model could not be reached or refused a request; ``str()`` is one readable line."""

    def __init__(self, message: str, status: int | None = None, detail: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.detail = detail  # the server's own words, for recognising refused parameters


def api_root(url: str) -> str:
    """The ``…/v1`` root of a server from what a user typed: ``host:8000``, ``http://h:8000`` or
    ``https://h/v1``; RemoteError for anything that is not an http(s) URL with a host."""
    text = url.strip()
    if not text:
        raise RemoteError("the server URL is empty")
    if "://" not in text:
        text = "http://" + text
    try:
        parsed = httpx.URL(text)
    except (httpx.InvalidURL, ValueError) as exc:
        raise RemoteError(f"{url!r} is not a URL ({exc})") from None
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise RemoteError(f"{url!r}: a server URL starts with http:// or https:// and names a host")
    path = parsed.path.rstrip("/")
    if not path.endswith("/v1"):
        path += "/v1"
    return str(parsed.copy_with(path=path, query=None, fragment=None))


def where(url: str) -> str:
    """host:port of a URL, for messages."""
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, ValueError):
        return "the server"
    return f"{parsed.host}:{parsed.port}" if parsed.port else str(parsed.host)


def headers(api_key: str | None) -> dict[str, str]:
    h = {"Accept": "application/json"}
    if api_key:
        h["Authorization"] = f"Bearer {api_key}"
    return h


def server_message(body: bytes | str) -> str:
    """The server's own explanation from an error body: OpenAI's ``error.message``, FastAPI's
    ``detail``, or the text itself."""
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
    try:
        doc = json.loads(text)
    except ValueError:
        return text.strip()
    if isinstance(doc, dict):
        err = doc.get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
        for key in ("detail", "message", "error"):
            value = doc.get(key)
            if isinstance(value, str) and value:
                return value
            if isinstance(value, list) and value:  # FastAPI validation errors: a list of dicts
                return "; ".join(_validation_item(v) for v in value[:3])
    return text.strip()


def _validation_item(item: Any) -> str:
    if isinstance(item, dict):
        loc = ".".join(str(x) for x in item.get("loc", ()) if x != "body")
        return f"{loc}: {item.get('msg', '')}" if loc else str(item.get("msg", item))
    return str(item)


def status_error(
    status: int, body: bytes | str, url: str, model: str = "", api_key: str | None = None
) -> RemoteError:
    """The one line for an HTTP error answer."""
    detail = one_line(server_message(body), fold=True, limit=MESSAGE_CHARS, secret=api_key)
    host = where(url)
    said = f": {detail}" if detail else ""
    if status in (401, 403):
        what = "no API key or a wrong one" if status == 401 else "the API key may not use this"
        return RemoteError(f"{host} refused the request ({what}, HTTP {status}){said}", status, detail)
    if status == 404:
        if model and ("model" in detail.lower() or model in detail):
            return RemoteError(f"{host} has no model named {model!r} (HTTP 404){said}", status, detail)
        path = httpx.URL(url).path
        return RemoteError(
            f"{host} has no {path} (HTTP 404): is this an OpenAI-compatible server and the URL right?",
            status,
            detail,
        )
    if status == 429:
        return RemoteError(
            f"{host} is busy or rate-limited (HTTP 429); try again later{said}", status, detail
        )
    if status >= 500:
        return RemoteError(f"{host} failed (HTTP {status}){said}", status, detail)
    return RemoteError(f"{host} refused the request (HTTP {status}){said}", status, detail)


def transport_error(exc: BaseException, url: str) -> RemoteError:
    """The one line for a failure below HTTP: refused connection, DNS, TLS, a dropped stream."""
    host = where(url)
    text = _chain_text(exc)
    low = text.lower()
    if isinstance(exc, httpx.ConnectTimeout):
        return RemoteError(f"could not connect to {host} within {CONNECT_TIMEOUT_S:g} s")
    if isinstance(exc, ssl.SSLError) or "ssl" in low or "certificate" in low or "tls" in low:
        return RemoteError(f"TLS with {host} failed: {one_line(text, fold=True, limit=MESSAGE_CHARS)}")
    if any(
        m in low
        for m in ("name or service not known", "nodename nor servname", "getaddrinfo", "name resolution")
    ):
        return RemoteError(f"cannot find the server {host}: its name does not resolve (DNS)")
    if "refused" in low or "errno 111" in low or "errno 61" in low or "winerror 10061" in low:
        return RemoteError(f"connection refused by {host}: is the server running on that port?")
    if isinstance(exc, (httpx.RemoteProtocolError, httpx.ReadError)):
        return RemoteError(f"{host} closed the connection mid-reply (the server may have stopped)")
    if isinstance(exc, httpx.TimeoutException):
        return RemoteError(f"{host} did not answer in time")
    said = one_line(text, fold=True, limit=MESSAGE_CHARS) or type(exc).__name__
    return RemoteError(f"cannot reach {host}: {said}")


def _chain_text(exc: BaseException) -> str:
    """The messages of an exception and its causes (httpx wraps the OS error)."""
    parts: list[str] = []
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if str(cur):
            parts.append(str(cur))
        cur = cur.__cause__ or cur.__context__
    return " | ".join(parts)


@dataclass(frozen=True)
class ServedModel:
    """One entry of ``GET /v1/models``."""

    name: str
    context_length: int  # 0 when the server does not say
    owned_by: str = ""
    # What ``nanoscope serve`` states of its tokenizer: the file's SHA-256 and the vocabulary's
    # size, so that its token ids compare with a local copy's ("" and 0 from other servers).
    tokenizer_sha256: str = ""
    vocab_size: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "context_length": self.context_length, "owned_by": self.owned_by}


def parse_models(doc: Any) -> list[ServedModel]:
    """The models of a ``/v1/models`` answer (entries without an id are skipped)."""
    data = doc.get("data") if isinstance(doc, dict) else doc
    if not isinstance(data, list):
        raise RemoteError("the server's model list is not an OpenAI-style list")
    models = []
    for item in data[:MAX_MODELS]:
        if isinstance(item, dict) and isinstance(item.get("id"), str) and item["id"]:
            digest = item.get("tokenizer_sha256")
            vocab = item.get("vocab_size")
            models.append(
                ServedModel(
                    item["id"],
                    context_of(item),
                    str(item.get("owned_by") or ""),
                    digest if isinstance(digest, str) and SHA256_HEX.fullmatch(digest) else "",
                    vocab if isinstance(vocab, int) and _count(vocab) else 0,
                )
            )
    return models


def context_of(item: dict[str, Any]) -> int:
    """The context length a model entry states, in its own field or in llama-server's ``meta``."""
    meta = item.get("meta")
    for source in (item, meta if isinstance(meta, dict) else {}):
        for key in (*CONTEXT_FIELDS, "n_ctx_train"):
            value = source.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
    return 0


def _count(value: Any) -> bool:
    """A positive int a server could really mean (not a bool, below 2**31)."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 < value < 2**31


def list_models(url: str, api_key: str | None = None, timeout: float | None = None) -> list[ServedModel]:
    """``GET /v1/models`` (blocking: call it off the GUI thread); RemoteError with one line.

    ``timeout`` (default :data:`LIST_TIMEOUT_S`) seconds in all, from connecting to the body's
    last byte: httpx's timeouts are per operation, so a server trickling its headers or body a
    byte at a time would reset them for ever. The request runs on a private event loop
    (:class:`~.steps.StepRunner`) that gives it up at that deadline. Asked uncompressed and read
    raw, at most :data:`MAX_MODELS_BYTES`: a compressed body could inflate to gigabytes.
    """
    endpoint = api_root(url) + "/models"
    timeout = LIST_TIMEOUT_S if timeout is None else timeout
    runner = StepRunner()
    try:
        status, body = runner.run(_fetch_models(endpoint, api_key, timeout), timeout)
    except TimedOut:
        raise RemoteError(f"{where(endpoint)} did not answer /v1/models within {timeout:g} s") from None
    except httpx.HTTPError as exc:
        logger.info("listing models of %s failed: %s", where(endpoint), type(exc).__name__)
        raise transport_error(exc, endpoint) from None
    finally:
        runner.close()
    if status != 200:
        raise status_error(status, body, endpoint, api_key=api_key)
    try:
        doc = loads_bounded(body.decode("utf-8", "replace"))
    except JsonRefused:
        raise RemoteError(f"{where(endpoint)} answered /v1/models with something that is not JSON") from None
    return parse_models(doc)


async def _fetch_models(endpoint: str, api_key: str | None, timeout: float) -> tuple[int, bytes]:
    """The status and raw body of ``GET endpoint``, the body refused past MAX_MODELS_BYTES."""
    limits = httpx.Timeout(timeout, connect=CONNECT_TIMEOUT_S)
    asked = {**headers(api_key), "Accept-Encoding": "identity"}
    async with (
        httpx.AsyncClient(timeout=limits, trust_env=False) as client,
        client.stream("GET", endpoint, headers=asked) as response,
    ):
        encoding = response.headers.get("content-encoding", "identity").strip().lower()
        if encoding not in ("", "identity"):
            raise RemoteError(f"{where(endpoint)} sent its model list compressed ({encoding[:20]}), unasked")
        body = bytearray()
        async for chunk in response.aiter_raw():
            body += chunk
            if len(body) > MAX_MODELS_BYTES:
                mb = MAX_MODELS_BYTES >> 20
                raise RemoteError(f"{where(endpoint)} sent more than {mb} MB for its model list")
        return response.status_code, bytes(body)


# A field name as a server quotes it in an error: 'top_k', "top_k", `top_k` or bare.
def named_fields(detail: str, candidates: tuple[str, ...]) -> set[str]:
    """Which of ``candidates`` an error message names as whole words."""
    return {
        name
        for name in candidates
        if re.search(rf"(?<![A-Za-z0-9_]){re.escape(name)}(?![A-Za-z0-9_])", detail)
    }
