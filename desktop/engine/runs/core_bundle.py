"""nanochat's CORE tasks, from its ``eval_bundle``, scored as nanochat scores them (Qt-free).

nanochat's ``scripts/base_eval.py`` reads ``$NANOCHAT_BASE_DIR/eval_bundle``: ``core.yaml`` lists
the tasks (``icl_tasks``: ``label``, ``dataset_uri`` under ``eval_data/``, ``num_fewshot``,
``icl_task_type``, ``continuation_delimiter``), ``eval_meta_data.csv`` gives each task's random
baseline (percent), and each task is a JSONL of examples. ``nanochat/core_eval.py`` scores three
kinds, each example as text after BOS, with few-shot examples drawn by ``Random(1234 + index)``
from the other examples and joined by a blank line:

* **multiple_choice** (``query``, ``choices``, ``gold``): one sequence per choice, ``query +
  delimiter + choice``; the choice whose tokens after the common prefix have the lowest mean
  loss is the answer;
* **schema** (``context_options``, ``continuation``, ``gold``): one sequence per context,
  ``context + delimiter + continuation``; the context under which the common suffix has the
  lowest mean loss is the answer;
* **language_modeling** (``context``, ``continuation``): right when the greedy (argmax)
  prediction at every continuation position is the continuation's token.

Each task's accuracy is centered on its random baseline, ``(acc - b/100) / (1 - b/100)``, and
CORE is the mean of the centered accuracies. nanochat shuffles each task with ``Random(1337)``
before taking its first ``--max-per-task`` examples; a **lite N** sweep does the same, so its
numbers are nanochat's ``--max-per-task N`` numbers.

Text is joined as nanochat's templates join it, in plain Python (no template engine). Files are
read through engine/files; a broken line is one problem naming the file and line, and skipped
(nanochat's shuffle then runs over the usable lines, so the order differs from nanochat's only
when a line was skipped).
"""

from __future__ import annotations

import csv
import io
import math
import random
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from desktop.engine.backend import Backend, LoadOptions, Prompt
from desktop.engine.errors import NanoscopeError
from desktop.engine.files.bounded import (
    FileRefused,
    named_path,
    parse_json,
    read_head_lines,
    read_text,
    read_yaml,
)
from desktop.engine.files.numbers import NumberRefused, parse_float
from desktop.engine.runs.records import parse_records
from desktop.engine.runs.sweep import EvalTask, step_sweep
from desktop.engine.runs.timeline import Point

BUNDLE_DIR = "eval_bundle"
KINDS = ("multiple_choice", "schema", "language_modeling")
SHUFFLE_SEED = 1337  # base_eval.py's subsampling shuffle
FEWSHOT_SEED = 1234  # core_eval.py: Random(1234 + index)
MAX_TASKS = 100  # nanochat's core.yaml has 22
MAX_EXAMPLES = 20_000  # per task read (nanochat's largest, squad, has 10,570)
MAX_FEWSHOT = 25  # nanochat uses 0, 3, 5 and 10
MAX_LINE_CHARS = 200_000
MAX_OPTIONS = 64  # choices or contexts of one example
MAX_OPTION_CHARS = 20_000
LITE = 100  # base_eval.py's own example: --max-per-task=100


@dataclass(frozen=True)
class CoreTask:
    label: str
    kind: str  # one of KINDS
    data: Path  # its JSONL
    fewshot: int
    delimiter: str
    baseline: float | None  # random baseline in percent, from eval_meta_data.csv


@dataclass(frozen=True)
class CoreExample:
    line: int  # 1-based, in the task's JSONL
    item: Mapping[str, Any]  # the checked fields of the line

    def prompt(self) -> str:
        """What the example asks, as a person would read it (for what flipped and Compare)."""
        if "query" in self.item:
            return str(self.item["query"])
        if "context_options" in self.item:
            return str(self.item["context_options"][self.item["gold"]])
        return str(self.item["context"]).strip()


@dataclass(frozen=True)
class CoreAnswer:
    """One step's answer to one example of one task."""

    stage: str
    step: int
    task: str
    line: int
    chosen: int  # the option picked (language modeling: 0 when every token was predicted)
    gold: int
    losses: tuple[float, ...]  # mean loss per option (language modeling: of the continuation)
    correct: bool
    refused: str = ""  # why the example could not be scored under this model (counted as wrong)

    def to_dict(self) -> dict[str, object]:
        """As JSON holds it: a loss that is not finite (an option with nothing to score) is None."""
        losses = [loss if math.isfinite(loss) else None for loss in self.losses]
        return {**self.__dict__, "losses": losses}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> CoreAnswer:
        losses = tuple(math.inf if loss is None else float(loss) for loss in d["losses"])
        return cls(**{**d, "losses": losses})


def bundle_of(base_dir: Path | None) -> Path | None:
    """``$NANOCHAT_BASE_DIR/eval_bundle`` when it holds a core.yaml, else None."""
    if base_dir is None:
        return None
    bundle = Path(base_dir) / BUNDLE_DIR
    return bundle if (bundle / "core.yaml").is_file() else None


def find_bundle(folder: Path | None, base_dir: Path | None) -> Path:
    """The eval_bundle to read: ``folder``, else the nanochat base dir's; one line when there
    is none. PathRefused for a ``folder`` no path can be."""
    bundle = named_path(folder) if folder is not None else bundle_of(base_dir)
    if bundle is None or not named_path(bundle / "core.yaml").is_file():
        where = bundle or Path(base_dir or "$NANOCHAT_BASE_DIR") / BUNDLE_DIR
        raise NanoscopeError(f"{where}: no eval_bundle (core.yaml); nanochat's base_eval downloads it")
    return bundle


def read_tasks(bundle: Path) -> tuple[list[CoreTask], list[str]]:
    """The bundle's tasks in core.yaml's order, and one line per task that cannot be used.
    FileRefused when core.yaml itself cannot be read."""
    config = read_yaml(bundle / "core.yaml", "eval_config")
    listed = config.get("icl_tasks") if isinstance(config, dict) else None
    if not isinstance(listed, list) or not listed:
        raise FileRefused(bundle / "core.yaml", "no icl_tasks list")
    baselines, problems = _baselines(bundle / "eval_meta_data.csv")
    tasks: list[CoreTask] = []
    for number, entry in enumerate(listed[:MAX_TASKS], 1):
        try:
            tasks.append(_task(entry, bundle, baselines))
        except ValueError as exc:
            problems.append(f"{bundle / 'core.yaml'}: task {number}: {exc}; skipped")
    if len(listed) > MAX_TASKS:
        problems.append(f"{bundle / 'core.yaml'}: only the first {MAX_TASKS} tasks are used")
    return tasks, problems


def _task(entry: object, bundle: Path, baselines: Mapping[str, float]) -> CoreTask:
    if not isinstance(entry, dict):
        raise ValueError("not a mapping")
    label, uri, kind = entry.get("label"), entry.get("dataset_uri"), entry.get("icl_task_type")
    shots, delimiter = entry.get("num_fewshot"), entry.get("continuation_delimiter", " ")
    if not isinstance(label, str) or not label or len(label) > 200:
        raise ValueError("no label")
    if kind not in KINDS:
        raise ValueError(f"icl_task_type must be one of {', '.join(KINDS)}")
    if not isinstance(uri, str) or not uri or Path(uri).is_absolute() or ".." in Path(uri).parts:
        raise ValueError("dataset_uri must be a path inside eval_data/")
    data = named_path(bundle / "eval_data" / uri)  # a NUL or an over-long name: PathRefused
    if isinstance(shots, list) and shots:
        shots = shots[0]  # base_eval.py takes the first
    if isinstance(shots, bool) or not isinstance(shots, int) or not 0 <= shots <= MAX_FEWSHOT:
        raise ValueError(f"num_fewshot must be 0 to {MAX_FEWSHOT}")
    if not isinstance(delimiter, str) or len(delimiter) > 1_000:
        raise ValueError("continuation_delimiter must be a text")
    return CoreTask(label, kind, data, shots, delimiter, baselines.get(label))


def _baselines(path: Path) -> tuple[dict[str, float], list[str]]:
    """Each task's random baseline (percent); a missing or broken file leaves tasks uncentered."""
    try:
        text = read_text(path, "eval_config")
    except FileRefused as exc:
        return {}, [f"{exc}; accuracies are not centered"]
    baselines: dict[str, float] = {}
    try:
        for row in csv.DictReader(io.StringIO(text)):
            try:
                value = parse_float(row.get("Random baseline") or "")
            except NumberRefused:
                continue
            if 0 <= value < 100:
                baselines[str(row.get("Eval Task"))] = value
    except csv.Error as exc:
        return baselines, [f"{path}: not CSV ({exc}); some accuracies are not centered"]
    return baselines, []


def read_examples(task: CoreTask, lite: int | None = None) -> tuple[list[CoreExample], list[str]]:
    """The task's usable examples in nanochat's shuffled order, the first ``lite`` of them when
    given, and one line per problem. FileRefused when the JSONL cannot be read."""
    lines, more = read_head_lines(task.data, "eval_data", MAX_EXAMPLES)
    examples, problems, _ = parse_records(
        lines, lambda line, number: CoreExample(number, _item(line, number, task)), task.data
    )
    if more:
        problems.append(f"{task.data}: only the first {len(lines):,} lines are read")
    if not examples:
        raise FileRefused(task.data, f"no usable {task.kind} example")
    random.Random(SHUFFLE_SEED).shuffle(examples)
    if lite is not None:
        examples = examples[: max(1, lite)]
    if task.fewshot >= len(examples):
        problems.append(
            f"{task.data}: {task.fewshot}-shot needs more than {len(examples)} examples; "
            f"{len(examples) - 1}-shot is used"
        )
    return examples, problems


def _item(line: str, number: int, task: CoreTask) -> dict[str, Any]:
    if len(line) > MAX_LINE_CHARS:
        raise ValueError(f"a line of {len(line):,} characters (at most {MAX_LINE_CHARS:,})")
    try:
        data = parse_json(line, f"{task.data}:{number}", max_depth=4)
    except FileRefused:
        raise ValueError("not a JSON object") from None
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    if task.kind == "language_modeling":
        context, continuation = data.get("context"), data.get("continuation")
        if not _text(context) or not _text(continuation):
            raise ValueError(f"context and continuation: texts of 1 to {MAX_OPTION_CHARS:,} characters")
        return {"context": context, "continuation": continuation}
    mc = task.kind == "multiple_choice"
    field, fixed = ("choices", "query") if mc else ("context_options", "continuation")
    options, other, gold = data.get(field), data.get(fixed), data.get("gold")
    if not isinstance(options, list) or not 2 <= len(options) <= MAX_OPTIONS:
        raise ValueError(f"{field} must be a list of 2 to {MAX_OPTIONS} texts")
    if not all(_text(o) for o in options) or not isinstance(other, str):
        raise ValueError(f"{field} and {fixed} must be texts of at most {MAX_OPTION_CHARS:,} characters")
    if len(other) > MAX_OPTION_CHARS:
        raise ValueError(f"{fixed} is over {MAX_OPTION_CHARS:,} characters")
    if isinstance(gold, bool) or not isinstance(gold, int) or not 0 <= gold < len(options):
        raise ValueError(f"gold must be an index into {field}")
    return {field: tuple(options), fixed: other, "gold": gold}


def _text(value: object) -> bool:
    return isinstance(value, str) and 0 < len(value) <= MAX_OPTION_CHARS


def fewshot_of(examples: Sequence[CoreExample], index: int, shots: int) -> list[CoreExample]:
    """core_eval.py's few-shot draw for the example at ``index``: ``Random(1234 + index)``
    samples ``shots`` of the other examples' positions."""
    if shots <= 0:
        return []
    others = [i for i in range(len(examples)) if i != index]
    rng = random.Random(FEWSHOT_SEED + index)
    return [examples[i] for i in rng.sample(others, min(shots, len(others)))]


def texts(task: CoreTask, example: CoreExample, fewshot: Sequence[CoreExample]) -> list[str]:
    """The texts nanochat's templates render: one per option (language modeling: the context
    alone, stripped as core_eval strips it, then with its continuation)."""
    item, d = example.item, task.delimiter
    if task.kind == "multiple_choice":
        lead = "".join(f"{e.item['query']}{d}{e.item['choices'][e.item['gold']]}\n\n" for e in fewshot)
        return [f"{lead}{item['query']}{d}{choice}" for choice in item["choices"]]
    if task.kind == "schema":
        lead = "".join(
            f"{e.item['context_options'][e.item['gold']]}{d}{e.item['continuation']}\n\n" for e in fewshot
        )
        return [f"{lead}{option}{d}{item['continuation']}" for option in item["context_options"]]
    lead = "".join(f"{e.item['context'].strip()}{d}{e.item['continuation']}\n\n" for e in fewshot)
    without = f"{lead}{item['context'].strip()}{d}"
    return [without.strip(), f"{without}{item['continuation']}"]


def common_length(sequences: Sequence[Sequence[int]], from_end: bool = False) -> int:
    """How many tokens all sequences share at their start (or end)."""
    shortest = min(len(s) for s in sequences)
    for i in range(shortest):
        at = -1 - i if from_end else i
        if any(s[at] != sequences[0][at] for s in sequences):
            return i
    return shortest


class Unscorable(ValueError):
    """An example this model's tokenizer cannot score as nanochat scores it (the reason)."""


# core_eval's batch_sequences_lm asserts the context's tokens are a prefix of the context with its
# continuation, and stops the whole evaluation when they are not; here only the example is lost.
MERGED = (
    "its continuation merges into the context's last token in this tokenizer (nanochat's "
    "core_eval stops on such an example); counted as wrong"
)


def spans(task: CoreTask, sequences: Sequence[Sequence[int]]) -> list[tuple[int, int]]:
    """(start, end) of the scored tokens in each sequence, as core_eval's batch_sequences_*;
    :class:`Unscorable` for a language-modelling example whose context and continuation merge."""
    if task.kind == "multiple_choice":
        start = common_length(sequences)
        return [(start, len(s)) for s in sequences]
    if task.kind == "schema":
        suffix = common_length(sequences, from_end=True)
        return [(len(s) - suffix, len(s)) for s in sequences]
    without, with_continuation = sequences
    if with_continuation[: len(without)] != without or len(without) >= len(with_continuation):
        raise Unscorable(MERGED)
    return [(len(without), len(with_continuation))]


def score_example(
    backend: Backend, task: CoreTask, examples: Sequence[CoreExample], index: int, lead: Sequence[int]
) -> tuple[int, tuple[float, ...], bool]:
    """(the option chosen, each option's mean loss, right) for one example under one model;
    ``lead`` is what every text follows (BOS)."""
    example = examples[index]
    rendered = texts(task, example, fewshot_of(examples, index, task.fewshot))
    sequences = [[*lead, *backend.encode(text)] for text in rendered]
    context_length = backend.info().context_length
    if task.kind == "language_modeling":
        (start, end), tokens = spans(task, sequences)[0], sequences[1]
        prompt = Prompt((), tuple(tokens[:start]), start, context_length)
        result = backend.score(prompt, tokens[start:end], top=1)
        greedy = all(row[0][0] == t for row, t in zip(result["top"], tokens[start:end], strict=True))
        loss = -sum(result["token_logprobs"]) / (end - start)
        return (0 if greedy else -1), (loss,), greedy
    losses = []
    for tokens, (start, end) in zip(sequences, spans(task, sequences), strict=True):
        if start < 1 or end <= start:  # nothing to score, or no token before it: never chosen
            losses.append(math.inf)
            continue
        result = backend.score(Prompt((), tuple(tokens[:start]), start, context_length), tokens[start:end])
        losses.append(-sum(result["token_logprobs"]) / (end - start))
    finite = [loss if math.isfinite(loss) else math.inf for loss in losses]
    chosen = finite.index(min(finite))
    return chosen, tuple(losses), chosen == example.item["gold"]


def lead_ids(backend: Backend) -> list[int]:
    """BOS, as core_eval prepends it; an error for a model without one."""
    lead = backend.render("", None, chat=False).ids
    if not lead:
        raise NanoscopeError("CORE scores text after BOS; this model has no BOS token")
    return list(lead)


def core_task(task: CoreTask, examples: Sequence[CoreExample]) -> EvalTask:
    """One CORE task as one task of a :func:`~desktop.engine.runs.sweep.tasks_sweep` (named
    "core:<label>"; its items are positions in ``examples``, each result a :class:`CoreAnswer`)."""

    def ask(backend: Backend, point: Point, index: int) -> CoreAnswer:
        example = examples[index]
        gold, refused = int(example.item.get("gold", 0)), ""
        try:
            chosen, losses, right = score_example(backend, task, examples, index, lead_ids(backend))
        except Unscorable as exc:
            chosen, losses, right, refused = -1, (math.inf,), False, str(exc)
        where = (point.stage, point.step, task.label, example.line)
        return CoreAnswer(*where, chosen, gold, losses, right, refused)

    return EvalTask(f"core:{task.label}", range(len(examples)), ask)


def core_sweep(
    points: Sequence[Point],
    task: CoreTask,
    examples: Sequence[CoreExample],
    *,
    options: LoadOptions | None = None,
    cancel: threading.Event | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> Iterator[CoreAnswer]:
    """Each step's answer to each example of ``task``, one checkpoint open at a time."""
    one = core_task(task, examples)
    return step_sweep(points, one.items, one.ask, options=options, cancel=cancel, progress=progress)


def centered(accuracy: float, baseline: float | None) -> float | None:
    """base_eval.py's centering on the random baseline (percent)."""
    if baseline is None:
        return None
    return (accuracy - 0.01 * baseline) / (1.0 - 0.01 * baseline)


def core_metric(accuracies: Mapping[str, float], tasks: Sequence[CoreTask]) -> float | None:
    """CORE: the mean centered accuracy over ``tasks``; None unless every task has an accuracy
    and a baseline."""
    values = [centered(accuracies[t.label], t.baseline) if t.label in accuracies else None for t in tasks]
    if not values or any(v is None for v in values):
        return None
    return sum(v for v in values if v is not None) / len(values)


def core_scores(answers: Iterable[CoreAnswer], tasks: Sequence[CoreTask]) -> dict[tuple[str, int], float]:
    """CORE per (stage, step), for the steps whose answers cover every one of ``tasks``."""
    right: dict[tuple[str, int], dict[str, list[bool]]] = {}
    for a in answers:
        right.setdefault((a.stage, a.step), {}).setdefault(a.task, []).append(a.correct)
    out = {}
    for at, by_task in right.items():
        shares = {label: sum(marks) / len(marks) for label, marks in by_task.items() if marks}
        metric = core_metric(shares, tasks)
        if metric is not None:
            out[at] = metric
    return out
