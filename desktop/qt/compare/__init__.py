"""The Compare screen: panes over the Qt-free ``session.compare`` state, and their model slots."""
