"""``nanoscope eval RUN --task TASK[,TASK...] [--data PATH] [--lite N] [--steps A,B] [--json]``:
evaluate a run's saved steps, one checkpoint in memory at a time, every chosen task asked of a
step before the next step opens.

Tasks (docs/EVALS.md):

* ``samples``: nanochat's seven base_train prompts (or ``--prompt``), greedy, 16 tokens;
* ``mc``: multiple choice from ``--data FILE.jsonl`` by nanochat's categorical method;
* ``answers``: the bundled arithmetic and letter counting problems, replies checked, calculator
  calls counted;
* ``bpb``: bits per byte of the text in ``--data FILE``;
* ``core`` (every task of nanochat's eval_bundle) or ``core:LABEL``: from ``--data FOLDER`` or
  ``$NANOCHAT_BASE_DIR/eval_bundle``, scored as nanochat's core_eval scores them.

``--lite N`` asks the first N examples of each task (for CORE, nanochat's ``--max-per-task N``:
its shuffle, then the first N) and the output names it. A step's answers kept from an earlier
run (same weights, same questions, same settings) are read back, and stderr says so. Graded
tasks end with what flipped from the first step to the last.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from desktop.cli.say import say, warn
from desktop.config import paths
from desktop.engine.errors import NanoscopeError
from desktop.engine.text_lines import one_line

if TYPE_CHECKING:
    from desktop.engine.runs.sweep import SweepProgress

TASKS = ("samples", "mc", "answers", "bpb", "core")
NEEDS_FILE = ("mc", "bpb")


def add_eval_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("eval", help="evaluate a run's saved steps, one at a time")
    p.add_argument("run", help="as for timeline")
    p.add_argument(
        "--task",
        required=True,
        help="comma-separated: samples (nanochat's base_train prompts, or --prompt), "
        "mc (multiple choice from --data FILE.jsonl: question, choices, answer), "
        "answers (bundled arithmetic and letter counting, replies checked), "
        "bpb (bits per byte of the text in --data), "
        "core or core:LABEL (nanochat's eval_bundle, from --data FOLDER or $NANOCHAT_BASE_DIR)",
    )
    p.add_argument("--data", default=None, help="mc: the JSONL; bpb: the text; core: the eval_bundle folder")
    p.add_argument("--lite", type=int, default=None, metavar="N", help="ask the first N examples per task")
    p.add_argument("--steps", default=None, help="comma-separated steps (default: every saved step)")
    p.add_argument("--prompt", action="append", default=None, help="your own prompt (repeatable, up to 100)")
    p.add_argument("--device", default="auto")
    p.add_argument("--json", action="store_true", help="one JSON line per answer, then what flipped")


@dataclass
class Planned:
    """One task of the sweep: the engine's task, its store key, and how to show it."""

    task: Any  # EvalTask
    key: Any  # TaskKey
    title: str
    prompts: dict[int, str] = field(default_factory=dict)  # line -> what it asks (graded tasks)
    core: Any = None  # the CoreTask, for core:LABEL


def cmd_eval(args: argparse.Namespace) -> int:
    from desktop.engine.backend import LoadOptions
    from desktop.engine.discovery import resolve_spec
    from desktop.engine.runs.sweep import tasks_sweep
    from desktop.engine.runs.timeline import timeline_of
    from desktop.store.eval_results import StoreKeeper, shared_results

    names = [n.strip() for n in args.task.split(",") if n.strip()]
    if args.lite is not None and args.lite < 1:
        raise NanoscopeError(f"--lite must be at least 1, got {args.lite}")
    base = paths.nanochat_base_dir()
    directory, _step = resolve_spec(args.run, base)
    points = _chosen_steps(directory, list(timeline_of(directory).points), args.steps)
    cancel = threading.Event()
    planned = _plan(names, args, base, cancel)
    keeper = StoreKeeper(shared_results(), {p.task.name: p.key for p in planned}, cancel)
    options = LoadOptions(device=args.device, base_dir=base, kernel_cache=paths.kernel_timings_file())
    results: dict[str, list[Any]] = defaultdict(list)
    said: set[tuple[str, int, str]] = set()
    shown = _show_progress if sys.stderr.isatty() else None
    sweep = tasks_sweep(
        points, [p.task for p in planned], options=options, cancel=cancel, progress=shown, keeper=keeper
    )
    by_name = {p.task.name: p for p in planned}
    unscored: set[tuple[str, int]] = set()
    for r in sweep:
        results[r.task].append(r.result)
        _warn_unscored(r.result, by_name[r.task], unscored)
        step = (r.result.stage, r.result.step, r.task)
        if r.kept and step not in said:
            said.add(step)
            say(f"nanoscope: {step[0]} step {step[1]}: {r.task}: kept results (same weights, same task)",
                file=sys.stderr)  # fmt: skip
        if args.json:
            say(json.dumps({**r.result.to_dict(), "task": r.task}), flush=True)
        elif r.task == "samples":
            _show_sample(r.result, results["samples"])
    if shown is not None:
        say(file=sys.stderr)
    if not args.json:
        for p in planned:
            _show_summary(p, results[p.task.name])
        _show_core(planned, results)
    for p in planned:
        _show_flips(p, results[p.task.name], args.json)
    return 0


def _warn_unscored(result: Any, planned: Planned, said: set[tuple[str, int]]) -> None:
    """One warning per CORE example a model could not score (``CoreAnswer.refused``), the
    first time a step meets it."""
    reason = getattr(result, "refused", "")
    if reason and planned.core is not None and (planned.task.name, result.line) not in said:
        said.add((planned.task.name, result.line))
        warn(f"{planned.core.data}:{result.line}: {reason}")


def _chosen_steps(directory: Path, points: list, steps: str | None) -> list:
    if not steps:
        return points
    try:
        wanted = {int(s) for s in steps.split(",")}
    except ValueError:
        raise NanoscopeError(f"--steps {steps!r}: comma-separated step numbers") from None
    missing = wanted - {p.step for p in points}
    if missing:
        raise NanoscopeError(f"{directory}: no saved step {', '.join(map(str, sorted(missing)))}")
    return [p for p in points if p.step in wanted]


def _plan(
    names: list[str], args: argparse.Namespace, base: Path | None, cancel: threading.Event
) -> list[Planned]:
    """Each named task read and keyed; one line (NanoscopeError) for a name or file that cannot
    be used; warnings for lines skipped."""
    unknown = [n for n in names if n.split(":", 1)[0] not in TASKS]
    if not names or unknown:
        raise NanoscopeError(f"--task {args.task!r}: choose from {', '.join(TASKS)} (or core:LABEL)")
    needing = [n for n in names if n in NEEDS_FILE]
    if len(needing) > 1:
        raise NanoscopeError(f"--task {','.join(needing)}: each reads --data; evaluate them one at a time")
    if args.data and any(n.startswith("core") for n in names) and needing:
        raise NanoscopeError(f"--data is for {needing[0]}; core then reads $NANOCHAT_BASE_DIR/eval_bundle")
    planned: list[Planned] = []
    core_labels = [n.split(":", 1)[1] if ":" in n else "" for n in names if n.split(":", 1)[0] == "core"]
    for name in dict.fromkeys(n for n in names if not n.startswith("core")):
        planned.append(_plan_one(name, args, cancel))
    if core_labels:
        planned.extend(_plan_core(core_labels, args, base))
    return planned


def _plan_one(name: str, args: argparse.Namespace, cancel: threading.Event) -> Planned:
    from desktop.engine.runs import bits_per_byte, checked_answers, evals, multiple_choice
    from desktop.store import eval_results as kept

    lite = f" (lite {args.lite})" if args.lite else ""
    if name == "samples":
        prompts = (args.prompt or list(evals.SAMPLE_PROMPTS))[: args.lite]
        try:
            task = evals.samples_task(prompts, cancel)
        except ValueError as exc:  # more prompts than a sweep asks (evals.MAX_PROMPTS)
            raise NanoscopeError(f"--prompt: {exc}") from None
        return Planned(task, kept.samples_key(prompts), "sample prompts" + lite)
    if name == "answers":
        problems = checked_answers.bundled_problems()[: args.lite]
        return Planned(
            checked_answers.answers_task(problems, cancel),
            kept.answers_key(problems),
            "checked answers" + lite,
            {p.line: p.question for p in problems},
        )
    if name == "mc":
        needs = "FILE.jsonl (question, choices, answer)"
        questions, problems = _read(args, multiple_choice.read_questions, needs)
        _warn(problems)
        questions = questions[: args.lite]
        return Planned(
            multiple_choice.mc_task(questions),
            kept.choices_key(questions),
            f"multiple choice: {Path(args.data).name}{lite}",
            {q.line: q.question for q in questions},
        )
    text, more = _read(args, bits_per_byte.read_text, "FILE (the text to measure)")
    bpb = bits_per_byte.bpb_task(text, more, cancel)
    return Planned(bpb, kept.bits_key(text), f"bits per byte: {args.data}")


def _plan_core(labels: list[str], args: argparse.Namespace, base: Path | None) -> list[Planned]:
    from desktop.engine.files.bounded import FileRefused
    from desktop.engine.runs import core_bundle
    from desktop.store.eval_results import core_key

    try:
        bundle = core_bundle.find_bundle(Path(args.data) if args.data else None, base)
        tasks, problems = core_bundle.read_tasks(bundle)
    except FileRefused as exc:
        raise NanoscopeError(str(exc)) from None
    _warn(problems)
    by_label = {t.label: t for t in tasks}
    wanted = tasks if "" in labels else []
    for label in labels:
        if label and label not in by_label:
            known = ", ".join(list(by_label)[:10])
            raise NanoscopeError(f"{bundle / 'core.yaml'}: no task {label!r} (there are {known}…)")
        if label and by_label[label] not in wanted:
            wanted.append(by_label[label])
    lite = f" (lite {args.lite}: nanochat's --max-per-task {args.lite})" if args.lite else ""
    planned = []
    for task in wanted:
        try:
            examples, problems = core_bundle.read_examples(task, args.lite)
        except FileRefused as exc:
            warn(f"{exc}; skipped")
            continue
        _warn(problems)
        prompts = {e.line: e.prompt() for e in examples}
        one = core_bundle.core_task(task, examples)
        key = core_key(task, examples, args.lite)
        planned.append(Planned(one, key, f"CORE {task.label}{lite}", prompts, task))
    if not planned:
        raise NanoscopeError(f"{bundle}: no CORE task could be read")
    return planned


def _read(args: argparse.Namespace, read: Any, needs: str) -> Any:
    """What ``--data`` names, read by ``read``; one line when it is missing or cannot be read."""
    from desktop.engine.files.bounded import FileRefused, named_path

    if not args.data:
        raise NanoscopeError(f"--task {args.task} needs --data {needs}")
    try:
        return read(named_path(args.data))
    except FileRefused as exc:
        raise NanoscopeError(str(exc)) from None


def _warn(problems: list[str]) -> None:
    for problem in problems:
        warn(problem)


def _show_progress(p: SweepProgress) -> None:
    """One line on a terminal's stderr, rewritten in place: items asked and the time left."""
    left = f", about {p.seconds_left:.0f} s left" if p.seconds_left is not None else ""
    line = one_line(f"{p.done}/{p.total} asked, {p.stage} step {p.step}{left}")
    # Not say(): a carriage return and no newline, so the next update overwrites this one.
    sys.stderr.write(f"\r{line}   ")
    sys.stderr.flush()


def _show_sample(sample: Any, shown: list[Any]) -> None:
    if len(shown) == 1 or (shown[-2].stage, shown[-2].step) != (sample.stage, sample.step):
        say(f"{sample.stage} step {sample.step}:", flush=True)
    say(f"  {sample.prompt}{sample.text!r}", flush=True)


def _show_summary(planned: Planned, results: list[Any]) -> None:
    from desktop.engine.runs.grading import accuracy

    name = planned.task.name
    if name == "samples" or not results:
        return
    say(f"{planned.title}:")
    if name == "bpb":
        for r in results:
            short = " (the text's start only)" if r.cut else ""
            say(f"  {r.stage} step {r.step}: {r.bits_per_byte:.4f} bits per byte over {r.tokens:,} tokens, "
                f"{r.bytes:,} bytes{short}")  # fmt: skip
        return
    for (stage, step), share in accuracy(results).items():
        mine = [r for r in results if (r.stage, r.step) == (stage, step)]
        line = f"  {stage} step {step}: {sum(r.correct for r in mine)}/{len(mine)} right ({share:.1%})"
        if name == "answers":
            calls, marked = sum(r.calculator_calls for r in mine), sum(r.marked for r in mine)
            line += f", {calls} calculator calls, {marked} answers after ####"
        say(line, flush=True)


def _show_core(planned: list[Planned], results: dict[str, list[Any]]) -> None:
    """CORE per step (the mean centered accuracy) when every task of the bundle was asked."""
    from desktop.engine.runs.core_bundle import core_scores

    core = [p for p in planned if p.core is not None]
    answers = [a for p in core for a in results[p.task.name]]
    for (stage, step), metric in core_scores(answers, [p.core for p in core]).items():
        say(f"CORE over {len(core)} tasks, {stage} step {step}: {metric:.4f}")


def _show_flips(planned: Planned, results: list[Any], as_json: bool) -> None:
    from desktop.engine.runs.grading import accuracy, flipped_examples

    if planned.task.name in ("samples", "bpb"):
        return
    steps = list(accuracy(results))
    if len(steps) < 2:
        return
    first, last = steps[0], steps[-1]
    flips = flipped_examples(results, first, last, planned.prompts)
    if as_json:
        lost = [{"line": f.line, "prompt": f.prompt} for f in flips if f.lost]
        gained = [{"line": f.line, "prompt": f.prompt} for f in flips if not f.lost]
        shown = {"from": list(first), "to": list(last), "lost": lost, "gained": gained}
        say(json.dumps({"task": planned.task.name, **shown}))
        return
    say(f"{planned.title}: from step {first[1]} to {last[1]}: {sum(f.lost for f in flips)} lost, "
        f"{sum(not f.lost for f in flips)} gained")  # fmt: skip
    for f in flips:
        say(f"  {'lost' if f.lost else 'gained'} line {f.line}: {one_line(f.prompt, fold=True, limit=100)}")
