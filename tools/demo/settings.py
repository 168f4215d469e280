"""What one training run is: every number that changes the files it writes."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class RunSettings:
    out: Path = Path("resources/demo")
    tag: str = "demo"  # chatsft_checkpoints/<tag>/
    seed: int = 1337
    threads: int = 2  # part of the result: matmul sums are split by thread
    # Data
    conversations: int = 20_000
    max_exchanges: int = 16  # user/assistant pairs per chat at most (fewer when the context is full)
    documents: int = 450  # prose paragraphs trained on; as many more validate
    val_conversations: int = 200
    # Model (nanochat E7)
    n_layer: int = 4
    n_embd: int = 128
    n_head: int = 4
    sequence_len: int = 1024
    window_pattern: str = "SSSL"
    vocab_size: int = 1024  # a multiple of 64: wte and lm_head have no padding rows
    # Optimisation
    steps: int = 2400
    snapshots: int = 4  # steps saved, evenly spaced from first_snapshot to the final step
    first_snapshot: int = 300  # early enough to be clearly worse: Compare's step sweep shows it
    batch_size: int = 8
    lr: float = 3e-3
    warmup: int = 50
    eval_every: int = 200
    minutes: float = 90.0  # a safety net only: the run fails rather than ship a cut-short model
    # Grading through the engine
    grade_chats: int = 60
    grade_exchanges: int = 10
    require_showcase: bool = True  # fail unless the last step answers "What is 12 times 7?" with 84

    @property
    def snapshot_steps(self) -> list[int]:
        if self.snapshots == 1:
            return [self.steps]
        span = self.steps - self.first_snapshot
        return [round(self.first_snapshot + span * i / (self.snapshots - 1)) for i in range(self.snapshots)]

    def for_meta(self) -> dict[str, Any]:
        """The ``user_config`` block of the meta: the settings, with where they are written left
        out (a copy trained elsewhere must write the same bytes)."""
        return {k: v for k, v in asdict(self).items() if k not in ("out", "tag")}


# A seconds-long run with the same code paths, for tests and for trying changes; and the demo's
# speculative draft, a smaller depth of the same miniseries: the same data and seed, so the same
# tokenizer (compared by content when it drafts), half the layers, half the steps.
PRESETS: dict[str, RunSettings] = {
    "full": RunSettings(),
    "draft": RunSettings(
        tag="demo-d2",
        n_layer=2,
        steps=1200,
        snapshots=1,
        grade_chats=20,
        require_showcase=False,  # a draft proposes tokens; the depth-4 model answers
    ),
    "tiny": RunSettings(
        conversations=300,
        max_exchanges=4,
        documents=20,
        val_conversations=20,
        n_layer=2,
        n_embd=64,
        n_head=2,
        sequence_len=256,
        vocab_size=512,
        steps=12,
        snapshots=2,
        first_snapshot=6,
        batch_size=4,
        warmup=4,
        eval_every=6,
        grade_chats=2,
        grade_exchanges=3,
        require_showcase=False,  # 12 steps teach nothing; the run only proves the code paths
    ),
}


def preset(name: str, **changes: Any) -> RunSettings:
    return replace(PRESETS[name], **changes)
