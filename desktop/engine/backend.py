"""The seam between the app and a model: what the worker, the controllers, Compare and the CLI
know of any model, local or served (torch-free, Qt-free).

A :class:`Backend` describes itself with a frozen :class:`ModelInfo`, turns a conversation into
a :class:`Prompt` (reporting how much context it uses), streams a reply as
:class:`~desktop.engine.messages.TokenEvent` s, and, where it can, scores a given reply. The
nanochat engine (``nanochat_backend.py``) is the first implementation; other formats and served
models add theirs without touching the UI.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from desktop.engine.errors import ContextError, NanoscopeError
from desktop.engine.messages import Message, TokenEvent
from desktop.engine.params import SAMPLING_KEYS, SamplingParams

# Load progress: (percent, what is happening).
Progress = Callable[[int, str], None]

if TYPE_CHECKING:
    from desktop.engine.decode.protocols import Tokenizer


def stoppable(progress: Progress, stop: threading.Event | None, why: str) -> Progress:
    """``progress``, raising :class:`NanoscopeError` (``why``) instead once ``stop`` is set: a long
    job that reports at each of its stages (a load, an export) then ends at the next one."""

    def report(percent: int, message: str) -> None:
        if stop is not None and stop.is_set():
            raise NanoscopeError(why)
        progress(percent, message)

    return report


@dataclass(frozen=True)
class Capabilities:
    """What a backend can do; the UI greys out or explains what is missing."""

    token_ids: bool = True  # events carry real token ids (divergence and diffs by id)
    logprobs: bool = True  # per-token log-probabilities and alternatives
    seed: bool = True  # a seed reproduces a reply
    sampling: frozenset[str] = frozenset(SAMPLING_KEYS)  # the knobs it honours
    scoring: bool = True  # teacher-forced scoring of a given reply
    chat: bool = True  # renders conversations; False: completion of plain text
    draft_head: bool = False  # its own multi-token-prediction head can draft (the draft "mtp")
    # (capability, why it is missing) for what a backend cannot do, e.g. ("scoring", "the server …").
    unavailable: tuple[tuple[str, str], ...] = ()

    def why_not(self, capability: str) -> str:
        """The reason ``capability`` is missing, or ""."""
        return next((why for name, why in self.unavailable if name == capability), "")


# ModelInfo.tokenizer as a digest rather than a path: "sha256:<hex>", the digest of the tokenizer
# file a server states (``nanoscope serve``), compared with the digest of a local model's file.
SHA256_PREFIX = "sha256:"

# Reply meta key -> the ModelInfo field it records.
REPLY_META = {
    "family": "family",
    "checkpoint": "path",
    "name": "name",
    "source": "source",
    "tag": "tag",
    "step": "step",
    "era": "era",
    "device": "device",
    "dtype": "precision",
    "meta_hash": "meta_hash",
    "tokenizer": "tokenizer",
    "vocab_size": "vocab_size",
}


@dataclass(frozen=True)
class ModelInfo:
    """A loaded model as the app shows and records it."""

    family: str  # "nanochat", "nanochat-fork", ...
    path: str  # the checkpoint directory (or a server's model URL)
    name: str  # "sft/d20 · step 1,500"
    source: str  # where it came from: base / mid / sft / rl / folder / ...
    tag: str  # the run's tag (the directory name)
    step: int | None
    parameters: int
    context_length: int
    device: str  # "cpu", "cuda:0", "mps", ...
    device_name: str  # "CPU · 8 threads", "CUDA: NVIDIA H100"
    precision: str  # "float32", "fast", "int8", "bfloat16", ...
    capabilities: Capabilities = field(default_factory=Capabilities)
    era: str = ""  # the family's own generation label (nanochat: E0-E7, fork)
    attention: str = ""
    tokenizer: str = ""  # identity of the tokenizer: equal ones give ids the same meaning
    tokenizer_kind: str = ""
    vocab_size: int = 0
    meta_hash: str = ""
    warnings: tuple[str, ...] = ()
    load_seconds: float = 0.0
    kernels: tuple[str, ...] = ()  # which kernel computes each matrix shape, and why (local models)
    # Some kernel that changes this mode's numbers was chosen anew at this load (another CPU or
    # torch version, another thread count, or Settings › Re-measure kernels): replies of this
    # mode may differ from older ones for the same seed (engine/kernels/tuning.py).
    choices_renewed: bool = False

    def reply_meta(self) -> dict[str, Any]:
        """What a reply records about the model that wrote it (the keys of REPLY_META)."""
        return {key: getattr(self, attr) for key, attr in REPLY_META.items()}

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["capabilities"]["sampling"] = sorted(self.capabilities.sampling)
        d["warnings"] = list(self.warnings)
        return d


@dataclass(frozen=True)
class Prompt:
    """What a backend will feed the model for one request, and the context it uses."""

    messages: tuple[Message, ...]  # the conversation after any oldest turns were dropped
    ids: tuple[int, ...] | None  # the exact ids, where the backend tokenizes locally
    tokens: int  # prompt length in tokens
    context_length: int
    dropped_turns: int = 0
    truncated: bool = False  # the last message alone was too long; only its end was kept

    def require_ids(self) -> list[int]:
        """The exact ids, for a backend that computes on them; one line when there are none."""
        if self.ids is None:
            raise ContextError("this prompt has no token ids")
        return list(self.ids)

    def digest(self) -> str | None:
        """A short fingerprint of the exact ids (None without them): kept with a reply, it tells
        whether the conversation rendered again is what the model was fed."""
        if self.ids is None:
            return None
        return hashlib.sha256(",".join(map(str, self.ids)).encode()).hexdigest()[:16]

    def usage(self) -> dict[str, Any]:
        return {
            "prompt_tokens": self.tokens,
            "context_length": self.context_length,
            "dropped_turns": self.dropped_turns,
            "truncated": self.truncated,
        }


@dataclass(frozen=True)
class LoadOptions:
    """How to open a model; each backend uses the fields that apply to it."""

    step: int | None = None  # None: the latest
    device: str = "auto"
    dtype: str = "auto"
    tokenizer: Path | None = None  # an explicit tokenizer file or directory
    softcap: float | None = None  # override a logit softcap the checkpoint does not record
    base_dir: Path | None = None  # the nanochat base dir, for its shared tokenizer
    config: Path | None = None  # a KempnerForge run's training TOML (None: the one next to the run)
    kernel_cache: Path | None = None  # where this machine's kernel timings are kept (kernel_tuning)
    # Compile a draft checkpoint's forward in the background where this machine can
    # (engine/decode/compiled_draft.py); off for one-shot uses, which end before it is ready.
    compile_drafts: bool = False
    # With compile_drafts: seconds the load waits for fast and int8 mode's compiled step
    # (engine/decode/compiled_step.py), so that the first reply runs it (``generate --compiled``).
    compile_wait_s: float = 0.0
    # A served model ("remote:<server id>/<model>"): the server's URL and key (else the registry
    # looks the server id up), a display name, and how long a silent stream may pause.
    server_url: str | None = None
    api_key: str | None = field(default=None, repr=False)  # never in a log line or a message
    server_name: str = ""
    stall_timeout: float | None = None


@dataclass(frozen=True)
class ReplyStart:
    """How the reply begins, decided before it streams: what it had already *said* (the tokens
    before a fork point, or a whole reply to continue) and what the user *gives* at that point
    (an alternative picked in the probability popup, text typed, a prefill). Said tokens are not
    streamed again; given ones stream first, marked ``given``, then the model continues.

    Local backends use the ids (``given_text`` is encoded when ``given_ids`` is empty); served
    ones the texts."""

    said_ids: tuple[int, ...] = ()
    said_text: str = ""
    given_ids: tuple[int, ...] = ()
    given_text: str = ""


@dataclass(frozen=True)
class StreamOptions:
    """How to run one request (beyond the sampling values)."""

    logprobs: int = 0  # alternatives per token to report; 0 computes none
    threads: int | None = None  # intra-op threads for this run (CPU panes side by side)
    reuse_cache: bool = True  # keep the previous request's cache and prefill only what is new
    start: ReplyStart | None = None  # a fork, a continuation or a prefill
    # Speculative decoding: "" off; else the draft (see engine/decode/speculative.py), with
    # draft_k tokens proposed per step (0: adaptive).
    draft: str = ""
    draft_k: int = 0


DEFAULT_STREAM = StreamOptions()


@dataclass
class GenerationStats:
    prompt_tokens: int = 0
    prefilled_tokens: int = 0  # prompt tokens actually computed (fewer with the prefix cache)
    new_tokens: int = 0
    ttft_ms: float = 0.0
    decode_tok_s: float = 0.0
    stopped: str = ""  # "stop_token" | "max_tokens" | "cancelled" | "context"
    # Steps whose distribution could not be sampled (NaN, nothing kept by top-p, an overflowing
    # temperature) and took the most likely token instead (engine/decode/sampling.py); 0 normally.
    greedy_fallbacks: int = 0
    # Speculative decoding: tokens the draft proposed, and how many of them the target kept.
    drafted: int = 0
    accepted: int = 0
    draft_compiled: bool = False  # the draft ran its compiled forward (engine/decode/compiled_draft.py)
    verifier_compiled: bool = False  # the target's passes ran its compiled twin (engine/decode/verifier.py)
    # A plain reply's one-row steps ran compiled (fast and int8 mode: engine/decode/compiled_step.py),
    # or why not, in a few words ("eager steps (compiling)"; "" where no
    # compiled step applies: exact mode, a GPU, speculative replies).
    step_compiled: bool = False
    step_eager: str = ""
    # A timing-driven choice this reply used was made anew where an earlier one existed (a
    # speculative draft's costs, its compiled twins, the verifying pass's kernels; or, on the first
    # reply after a load, ModelInfo.choices_renewed): it may differ from older replies to the same seed.
    choices_renewed: bool = False
    # Why a reply asked to draft drafted nothing, in a few words for its footer ("int8 copy not
    # faster on this CPU: drafted nothing"); "" when it drafted or was not asked to.
    draft_skipped: str = ""

    def to_dict(self) -> dict:
        return dict(self.__dict__)


class Backend(Protocol):
    """A loaded model. Every method runs on the model's worker thread."""

    def info(self) -> ModelInfo: ...

    def render(
        self,
        conversation: Sequence[Message] | str,
        max_tokens: int | None,
        chat: bool | None = None,
        cancel: threading.Event | None = None,
    ) -> Prompt:
        """The prompt for a conversation or a text (completion), oldest turns dropped to leave
        room for ``max_tokens`` (None: nothing is dropped). ``chat`` None lets the backend choose
        (a base checkpoint continues text); True asks for the chat format, an error without one.
        ``cancel``, set while a long prompt is tokenized, ends it (EncodingCancelled)."""
        ...

    def stream(
        self,
        prompt: Prompt,
        params: SamplingParams,
        cancel: threading.Event,
        options: StreamOptions = DEFAULT_STREAM,
        stats: GenerationStats | None = None,
    ) -> Iterator[TokenEvent]:
        """Stream the reply; stops after the current token once ``cancel`` is set."""
        ...

    def score(
        self,
        prompt: Prompt,
        reply_ids: Sequence[int],
        top: int = 0,
        skip: Sequence[bool] | None = None,
        choices: Sequence[int] = (),
    ) -> dict[str, Any]:
        """Teacher-forced log-probabilities of ``reply_ids`` after ``prompt`` (see engine.scoring);
        with ``choices``, also those tokens' log-probabilities at the reply's first position (a
        multiple-choice question's letters, in the same pass)."""
        ...

    def token_label(self, token_id: int) -> str:
        """How one token reads on its own (special tokens by name)."""
        ...

    def encode(self, text: str) -> list[int]:
        """``text`` as the model's token ids, no special tokens added (what an eval needs to
        find an answer letter's id or count a text's tokens); an error where ids are unknown."""
        ...

    def tokenizer(self) -> Tokenizer:
        """The model's own tokenizer (what a server's /tokenize, /detokenize and echo use); an
        error where ids are unknown (a served model)."""
        ...

    def close(self) -> None: ...
