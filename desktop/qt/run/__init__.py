"""The Run screen: a run's curves, its evaluations and report card, and their sweeps."""
