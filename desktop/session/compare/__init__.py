"""A Compare session's state: its panes and their runs, divergence and diffs (pure analysis), and
the "Same model?" report."""
