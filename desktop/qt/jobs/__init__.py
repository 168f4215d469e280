"""Work off the GUI thread other than a model's: one job runner with stop, progress and errors."""
