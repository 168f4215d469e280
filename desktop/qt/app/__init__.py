"""The composition root: the QApplication, the main window that holds one page per screen, the
smoke test and the desktop entry. The CLI imports ``app.run_app`` only to start the window."""
