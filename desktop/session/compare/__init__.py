"""The Compare screen's state without Qt: the session (``session.py``: panes, the round, results,
saving), each pane's state (``panes.py``), its run (``pane_run.py``), and the pure analysis of the
replies (``analysis.py``, ``same_model.py``)."""
