"""The window: every Qt module of the app, grouped by screen. Widgets render the Qt-free session
(``desktop.session``) and send the user's intents to it; no screen reads another screen's widgets.

``app/`` is the composition root (the QApplication, the main window shell, the smoke test and the
desktop entry); ``chat/``, ``compare/`` and ``run/`` are the three screens; ``widgets/`` what they
share; ``model/`` the model thread; ``jobs/`` the one way to run other work off the GUI thread."""
