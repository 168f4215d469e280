"""The trainer of the tiny chat model bundled with Nanoscope (``resources/demo/``).

    python -m tools.demo --out resources/demo          # the shipped model (about 30 min on 2 cores)
    python -m tools.demo --preset tiny --out /tmp/d    # a seconds-long smoke run

Modules, in the order a run uses them: :mod:`.settings` (what a run is), :mod:`.data` (synthetic
multi-turn chats with calculator calls), :mod:`.bpe` (the tokenizer, learned with ``rustbpe``),
:mod:`.examples` (chats to ids and nanochat's loss mask), :mod:`.training` (the model and its
optimisation), :mod:`.snapshots` (checkpoints in nanochat's layout), :mod:`.pipeline` (these,
from settings to saved steps), :mod:`.grading` (accuracy through the app's own engine),
:mod:`.report` (the tables), :mod:`.plot` (the loss curve) and :mod:`.cli` (the command).
"""
