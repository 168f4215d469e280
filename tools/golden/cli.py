"""``python -m tools.golden FAMILY [options]``: write one family's golden cases.

Families and their writers (each a module here with ``main(argv) -> int``):

* ``nanochat``: upstream karpathy/nanochat, one revision per era (:mod:`tools.golden.nanochat`);
* ``experiment``: a nanochat experiment of the experiment_refactor branch, PR #800
  (:mod:`tools.golden.experiment`);
* ``fork``: the C++ fork's variants (:mod:`tools.golden.fork`);
* ``kempnerforge``: a DCP run saved by KempnerForge's own checkpoint code (:mod:`tools.golden.kempnerforge`);
* ``transformers``: ``save_pretrained`` folders (:mod:`tools.golden.transformers_models`);
* ``attention``: attention rows of the nanochat and fork cases, by each revision's own attention
  code (:mod:`tools.golden.attention`; ``--src`` and ``--fork-src``).

Each takes ``--src`` (a fetched mirror or checkout of the upstream, where it has one) and ``--out``
(default ``tests/golden``), and records the exact commit of every upstream file it ran.
"""

from __future__ import annotations

import importlib
import sys

FAMILIES = {
    "nanochat": "tools.golden.nanochat",
    "experiment": "tools.golden.experiment",
    "fork": "tools.golden.fork",
    "kempnerforge": "tools.golden.kempnerforge",
    "transformers": "tools.golden.transformers_models",
    "attention": "tools.golden.attention",
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in FAMILIES:
        print(f"usage: python -m tools.golden {{{','.join(FAMILIES)}}} [options]", file=sys.stderr)
        return 2
    module = importlib.import_module(FAMILIES[argv[0]])
    return int(module.main(argv[1:]))
