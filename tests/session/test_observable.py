"""Session events: observers in order, once each, removable, and errors not swallowed."""

import pytest

from desktop.session.observable import Events


def test_observers_run_in_order_with_the_arguments():
    events = Events("changed")
    seen: list = []
    events.changed.connect(lambda *a: seen.append(("first", a)))
    events.changed.connect(lambda *a: seen.append(("second", a)))
    events.changed.emit(1, "x")
    assert seen == [("first", (1, "x")), ("second", (1, "x"))]


def test_an_observer_connected_twice_runs_once_and_can_leave():
    events = Events("changed")
    seen: list = []
    events.changed.connect(seen.append)
    events.changed.connect(seen.append)
    events.changed.emit(1)
    events.changed.disconnect(seen.append)
    events.changed.disconnect(seen.append)  # not connected any more: no error
    events.changed.emit(2)
    assert seen == [1]


def test_an_observer_may_disconnect_itself_while_the_event_runs():
    events = Events("changed")
    seen: list = []

    def once(value):
        seen.append(value)
        events.changed.disconnect(once)

    events.changed.connect(once)
    events.changed.connect(lambda v: seen.append(v * 10))
    events.changed.emit(1)
    events.changed.emit(2)
    assert seen == [1, 10, 20]


def test_an_unknown_event_and_a_failing_observer_are_errors():
    events = Events("changed")
    with pytest.raises(AttributeError, match="no event 'saved'"):
        _ = events.saved

    def broken(*_):
        raise RuntimeError("view bug")

    events.changed.connect(broken)
    with pytest.raises(RuntimeError, match="view bug"):
        events.changed.emit()
    assert events.names() == ("changed",)
