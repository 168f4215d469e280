"""What a request may say, and how an error is said (OpenAI's wire format, Qt-free).

Requests are parsed from the raw body by pydantic in strict JSON (``NaN`` and ``Infinity`` are
not JSON and are refused), with every size bounded here: nothing a request says may allocate
without limit. Unknown fields are ignored, as OpenAI-compatible servers do; fields that would
change the answer and are not supported (``logit_bias``, ``best_of``, penalties) are refused by
name instead of silently ignored.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from desktop.engine.params import SEED_MAX
from desktop.engine.text_lines import one_line

MAX_BODY_BYTES = 4 << 20  # a batch of prompts as token ids fits; a pasted book does not
MAX_PROMPTS = 64  # prompts in one completion request
MAX_N = 16  # choices per prompt
MAX_CHOICES = 128  # prompts × n
MAX_TOP_LOGPROBS = 20  # OpenAI's own limit
MAX_STOPS = 16
MAX_STOP_CHARS = 256
MAX_MESSAGES = 1024
MAX_TOKENS = 1 << 20  # past any context; the model's own context bounds it further
MAX_ID = 2**31 - 1
ERROR_CHARS = 300

Float = Annotated[float, Field(allow_inf_nan=False)]


class ApiError(Exception):
    """A request the server answers with an OpenAI-style error body and a 4xx (or 5xx) status."""

    def __init__(
        self, status: int, message: str, kind: str = "invalid_request_error", param: str | None = None
    ):
        super().__init__(message)
        self.status = status
        self.message = one_line(message, limit=ERROR_CHARS)
        self.kind = kind
        self.param = param

    def body(self) -> dict[str, Any]:
        return {
            "error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.status}
        }


def _refuse_set(value: Any, name: str, harmless: tuple[Any, ...]) -> Any:
    """``value`` when it asks for nothing (``harmless``), else a ValueError naming ``name``."""
    if value is not None and value not in harmless:
        raise ValueError(f"{name} is not supported by this server")
    return value


class Sampling(BaseModel):
    """The fields completions and chat completions share."""

    model_config = ConfigDict(extra="ignore", strict=False)

    model: str = Field(default="", max_length=512)
    max_tokens: int | None = Field(default=None, ge=0, le=MAX_TOKENS)
    temperature: Float | None = Field(default=None, ge=0.0, le=100.0)
    top_p: Float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=-1, le=MAX_ID)  # -1 and 0: off (vLLM, nanochat)
    min_p: Float | None = Field(default=None, ge=0.0, le=0.99)
    repetition_penalty: Float | None = Field(default=None, gt=0.0, le=100.0)
    seed: int | None = Field(default=None, ge=0, le=SEED_MAX)
    n: int = Field(default=1, ge=1, le=MAX_N)
    stop: str | list[Annotated[str, Field(max_length=MAX_STOP_CHARS)]] | None = Field(default=None)
    stream: bool = False
    stream_options: dict[str, bool] | None = None
    return_token_ids: bool = False  # vLLM's: every choice (and chunk) also carries its token ids
    presence_penalty: Float | None = None
    frequency_penalty: Float | None = None
    logit_bias: dict[str, Float] | None = Field(default=None, max_length=1)

    @field_validator("model", mode="before")
    @classmethod
    def _null_model(cls, value: Any) -> Any:
        # null, as vLLM takes it, is the served model (lm-evaluation-harness sends it so when
        # its model_args name no model)
        return "" if value is None else value

    @field_validator("stop")
    @classmethod
    def _stops(cls, value: str | list[str] | None) -> str | list[str] | None:
        if isinstance(value, str) and len(value) > MAX_STOP_CHARS:
            raise ValueError(f"a stop string may have at most {MAX_STOP_CHARS} characters")
        if isinstance(value, list) and len(value) > MAX_STOPS:
            raise ValueError(f"at most {MAX_STOPS} stop strings, got {len(value)}")
        return value

    @field_validator("presence_penalty", "frequency_penalty", "logit_bias")
    @classmethod
    def _unsupported(cls, value: Any, info: Any) -> Any:
        return _refuse_set(value, info.field_name, (0, {}))

    def stops(self) -> tuple[str, ...]:
        """The stop strings, empty ones left out (they would end every reply at once)."""
        items = [self.stop] if isinstance(self.stop, str) else list(self.stop or ())
        return tuple(s for s in items if s)

    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.get("include_usage"))


TokenIds = list[Annotated[int, Field(ge=0, le=MAX_ID)]]


class CompletionRequest(Sampling):
    """``POST /v1/completions``."""

    prompt: str | list[str] | TokenIds | list[TokenIds]
    logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    echo: bool = False
    best_of: int | None = None
    suffix: str | None = None

    @field_validator("best_of", "suffix")
    @classmethod
    def _unsupported_here(cls, value: Any, info: Any) -> Any:
        if info.field_name == "suffix" and value:
            raise ValueError("suffix (fill-in-the-middle) is not supported by this server")
        return _refuse_set(value, info.field_name, (1, ""))

    def prompts(self) -> list[str | list[int]]:
        """The prompt as a list of texts or id lists (OpenAI's four shapes)."""
        p = self.prompt
        if isinstance(p, str):
            out: list[str | list[int]] = [p]
        elif p and all(isinstance(x, int) for x in p):
            out = [list(p)]  # type: ignore[arg-type]
        else:
            out = list(p)  # type: ignore[arg-type]
        if not out:
            raise ApiError(400, "prompt is empty", param="prompt")
        if len(out) > MAX_PROMPTS:
            raise ApiError(400, f"at most {MAX_PROMPTS} prompts per request, got {len(out)}", param="prompt")
        if len(out) * self.n > MAX_CHOICES:
            raise ApiError(400, f"prompts × n may be at most {MAX_CHOICES}", param="n")
        return out


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: str
    text: str = ""


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[ContentPart] | None = None

    def text(self) -> str:
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        kinds = {p.type for p in self.content} - {"text"}
        if kinds:
            raise ApiError(400, f"only text content is supported, not {sorted(kinds)[0]}", param="messages")
        return "".join(p.text for p in self.content)


class ChatRequest(Sampling):
    """``POST /v1/chat/completions``."""

    messages: list[ChatMessage] = Field(min_length=1, max_length=MAX_MESSAGES)
    max_completion_tokens: int | None = Field(default=None, ge=0, le=MAX_TOKENS)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    continue_final_message: bool = False
    add_generation_prompt: bool = True
    tools: list[dict[str, Any]] | None = Field(default=None, max_length=0)  # nanochat's tool is its own

    def reply_limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class TokenizeRequest(BaseModel):
    """vLLM's ``POST /tokenize`` (lm-evaluation-harness's remote tokenizer)."""

    model_config = ConfigDict(extra="ignore")

    prompt: str
    add_special_tokens: bool = True


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    tokens: TokenIds


def check_ids(ids: list[int], vocab: int, param: str = "prompt") -> None:
    """ApiError(400) for token ids that hold an id past the vocabulary, or, as a prompt, are empty
    (nothing to continue from)."""
    if not ids and param == "prompt":
        raise ApiError(400, "a prompt of token ids is empty", param=param)
    bad = [i for i in ids if not 0 <= i < vocab]
    if bad:
        said = f"token ids out of range for the vocabulary of {vocab}: {bad[:5]}"
        raise ApiError(400, said, param=param)


def parse(model: type[BaseModel], body: bytes) -> Any:
    """``body`` as ``model``, or ApiError(400) naming the first bad field in one line."""
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        kind = first.get("type", "")
        if kind == "json_invalid":
            raise ApiError(400, "the body is not valid JSON (NaN and Infinity are not JSON)") from None
        message = first.get("msg", "invalid value")
        raise ApiError(400, f"{where}: {message}" if where else message, param=where or None) from None
