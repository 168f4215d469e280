"""API keys of servers in the OS keyring (macOS Keychain, Windows Credential Locker, the Secret
Service on Linux), through ``keyring``. Qt-free.

Where no keyring backend exists (a bare Linux box, a container), a key is kept in memory for
this session only and ``problem`` says so; it is never written anywhere else. Keys are stored
under the server's id, so renaming a server or changing its URL keeps its key.
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)

SERVICE = "Nanoscope servers"
NO_KEYRING = "no keyring is available on this system: the key is kept for this session only"


class KeyStore:
    """get / set / delete a server's key; ``problem`` is "" when the OS keyring is in use."""

    def __init__(self) -> None:
        self._session: dict[str, str] = {}
        self.problem = _keyring_problem()

    @property
    def persistent(self) -> bool:
        return not self.problem

    def get(self, server_id: str) -> str | None:
        if server_id in self._session:
            return self._session[server_id]
        if not self.persistent:
            return None
        import keyring
        from keyring.errors import KeyringError

        try:
            return keyring.get_password(SERVICE, server_id)
        except KeyringError as exc:
            logger.warning("reading the key of server %s from the keyring failed: %s", server_id, exc)
            return None

    def set(self, server_id: str, key: str) -> str:
        """Store ``key``; "" when it went to the keyring, else the reason it is kept for the session."""
        if not self.persistent:
            self._session[server_id] = key
            return self.problem
        import keyring
        from keyring.errors import KeyringError

        try:
            keyring.set_password(SERVICE, server_id, key)
        except KeyringError as exc:
            logger.warning("saving the key of server %s in the keyring failed: %s", server_id, exc)
            self._session[server_id] = key
            return f"the keyring refused the key ({exc}); it is kept for this session only"
        self._session.pop(server_id, None)
        return ""

    def delete(self, server_id: str) -> None:
        self._session.pop(server_id, None)
        if not self.persistent:
            return
        import keyring
        from keyring.errors import KeyringError, PasswordDeleteError

        try:
            keyring.delete_password(SERVICE, server_id)
        except PasswordDeleteError:
            pass  # there was none
        except KeyringError as exc:
            logger.warning("deleting the key of server %s from the keyring failed: %s", server_id, exc)


def _keyring_problem() -> str:
    """ "" when a real keyring backend is active, else why keys cannot be kept."""
    try:
        import keyring
        from keyring.backends import fail
    except ImportError:
        return NO_KEYRING
    try:
        backend = keyring.get_keyring()
    except Exception as exc:  # a broken backend configuration must not stop the app
        logger.warning("no usable keyring: %s", exc)
        return NO_KEYRING
    if isinstance(backend, fail.Keyring) or getattr(backend, "priority", 1) <= 0:
        return NO_KEYRING
    return ""


_store: KeyStore | None = None


def keystore() -> KeyStore:
    """The app's one key store (the session-only keys must be shared by every window)."""
    global _store
    if _store is None:
        _store = KeyStore()
    return _store


SERVE_KEY_ID = "nanoscope serve"  # the key clients give Nanoscope's own server (`nanoscope serve`)


def serve_key() -> tuple[str, bool, str]:
    """The key clients must give a Nanoscope server bound beyond this machine: (key, made now,
    why it is kept for this session only or ""). Made and stored the first time it is needed."""
    import secrets

    store = keystore()
    key = store.get(SERVE_KEY_ID)
    if key:
        return key, False, ""
    key = secrets.token_urlsafe(24)
    return key, True, store.set(SERVE_KEY_ID, key)
