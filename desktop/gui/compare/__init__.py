"""The Compare view's state: pure analysis, the per-pane run record, and the controller."""
