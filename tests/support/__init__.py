"""What the tests share: factories of checkpoints, tokenizers and models, reference
implementations, fake and real servers, and the paths of the repository and its golden
files."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
