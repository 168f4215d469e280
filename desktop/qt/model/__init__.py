"""The model thread: one long-lived worker per loaded model on its own QThread, and its slot."""
