"""A training run as a whole: its timeline of saved steps and what they say, and evaluations swept
across those steps (Qt-free; reads metas, logs and scalars, and opens one checkpoint at a time)."""
