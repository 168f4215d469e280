"""How a session tells its views that it changed, without Qt: named events with plain-callable
observers (napari's ``EmitterGroup`` in miniature). A Qt view connects its slot to an event and
re-renders from the session's state; tests connect a list's ``append``.

    class Chat:
        def __init__(self) -> None:
            self.events = Events("changed", "reply_token")

    chat.events.changed.connect(view.render)
    chat.events.changed.emit()

Observers run synchronously, in the order they connected, on the thread that emits: the GUI
thread, since only the Qt layer drives a session. An observer that raises stops the emission, as a
direct call would: a bug in a view must not be swallowed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Observer = Callable[..., Any]


class Event:
    """One kind of change; ``emit(*args)`` calls every connected observer with ``args``."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._observers: list[Observer] = []

    def connect(self, observer: Observer) -> Observer:
        """Call ``observer`` on every emission (once, however often it is connected)."""
        if observer not in self._observers:
            self._observers.append(observer)
        return observer

    def disconnect(self, observer: Observer) -> None:
        """Stop calling ``observer``; a no-op when it is not connected."""
        if observer in self._observers:
            self._observers.remove(observer)

    def emit(self, *args: Any) -> None:
        for observer in list(self._observers):  # a copy: an observer may disconnect itself
            observer(*args)

    def __repr__(self) -> str:
        return f"Event({self.name!r}, {len(self._observers)} observers)"


class Events:
    """A session's events by name: ``Events("changed", "saved").saved.connect(...)``."""

    def __init__(self, *names: str) -> None:
        self._events = {name: Event(name) for name in names}

    def __getattr__(self, name: str) -> Event:
        try:
            return self.__dict__["_events"][name]
        except KeyError:
            raise AttributeError(f"no event {name!r}") from None

    def names(self) -> tuple[str, ...]:
        return tuple(self._events)
