"""The window's state as plain Python objects that notify observers, Qt-free (as napari's
``components/`` under its ``_qt/``): the conversation, each Compare session, the Run session and
the sampling state. Qt widgets are views over these; tests drive them without a QApplication."""
