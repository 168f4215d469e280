"""nanochat's CORE tasks from an eval_bundle, scored as core_eval.py scores them: multiple choice
and schema by the lowest mean loss over the scored tokens, language modeling by every greedy
prediction matching; nanochat's shuffle for a lite sample, its few-shot draw, its text joins; a
bundle with broken or hostile lines gives one line per problem and the rest is asked."""

from __future__ import annotations

import json
import random

import pytest
import torch
from support import REPO
from support.eval_bundle import CORE_YAML, MC, make_bundle, write_jsonl

from desktop.engine.backend import LoadOptions
from desktop.engine.files.bounded import FileRefused
from desktop.engine.nanochat.backend import NanochatBackend
from desktop.engine.runs import core_bundle as core
from desktop.engine.runs.timeline import timeline_of

DEMO = REPO / "resources" / "demo" / "chatsft_checkpoints" / "demo"


@pytest.fixture(scope="module")
def demo():
    backend = NanochatBackend.open(DEMO, LoadOptions(device="cpu"))
    yield backend
    backend.close()


def direct_losses(backend, sequences: list[list[int]]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Per position: the loss of the next token and the argmax, from the model's own logits."""
    losses, argmax = [], []
    for ids in sequences:
        with torch.inference_mode():
            logits = backend.loaded.model(torch.tensor([ids]))[0].float()
        target = torch.tensor(ids[1:])
        losses.append(torch.nn.functional.cross_entropy(logits[:-1], target, reduction="none"))
        argmax.append(logits[:-1].argmax(-1))
    return losses, argmax


def test_the_bundle_is_read_as_base_eval_reads_it(tmp_path):
    bundle = core.bundle_of(tmp_path)
    assert bundle is None
    bundle = core.bundle_of(make_bundle(tmp_path).parent)
    tasks, problems = core.read_tasks(bundle)
    assert not problems
    assert [(t.label, t.kind, t.fewshot, t.delimiter, t.baseline) for t in tasks] == [
        ("mc_task", "multiple_choice", 0, " ", 33.3),
        ("mc_fewshot", "multiple_choice", 2, "\nAnswer: ", 33.3),
        ("schema_task", "schema", 0, " ", 50.0),
        ("lm_task", "language_modeling", 1, " ", 0.0),
    ]
    assert tasks[0].data == bundle / "eval_data" / "world" / "mc.jsonl"


def test_texts_join_as_nanochat_s_templates_and_fewshot_draws_as_core_eval(tmp_path):
    tasks, _ = core.read_tasks(make_bundle(tmp_path))
    mc_fewshot, schema, lm = tasks[1], tasks[2], tasks[3]
    examples, _ = core.read_examples(mc_fewshot)
    others = [i for i in range(len(examples)) if i != 2]
    drawn = [examples[i] for i in random.Random(1234 + 2).sample(others, 2)]
    assert core.fewshot_of(examples, 2, 2) == drawn
    lead = "".join(f"{e.item['query']}\nAnswer: {e.item['choices'][e.item['gold']]}\n\n" for e in drawn)
    item = examples[2].item
    want = [f"{lead}{item['query']}\nAnswer: {c}" for c in item["choices"]]
    assert core.texts(mc_fewshot, examples[2], drawn) == want
    s_examples, _ = core.read_examples(schema)
    e = s_examples[0]
    assert core.texts(schema, e, []) == [f"{o} {e.item['continuation']}" for o in e.item["context_options"]]
    lm_examples, _ = core.read_examples(lm)
    shot, e = lm_examples[1], lm_examples[0]
    prefix = f"{shot.item['context'].strip()} {shot.item['continuation']}\n\n{e.item['context'].strip()} "
    assert core.texts(lm, e, [shot]) == [prefix.strip(), prefix + e.item["continuation"]]


def test_a_lite_sample_is_nanochat_s_shuffle_then_the_first_n(tmp_path):
    rows = [{"query": f"q{i}", "choices": ["a", "b"], "gold": i % 2} for i in range(50)]
    tasks, _ = core.read_tasks(make_bundle(tmp_path))
    write_jsonl(tasks[0].data, rows)
    order = list(range(1, 51))
    random.Random(1337).shuffle(order)
    examples, problems = core.read_examples(tasks[0], lite=10)
    assert [e.line for e in examples] == order[:10] and not problems
    assert [e.line for e in core.read_examples(tasks[0])[0]] == order


def test_multiple_choice_is_the_lowest_mean_loss_after_the_common_prefix(tmp_path, demo):
    task = core.read_tasks(make_bundle(tmp_path))[0][0]
    examples, _ = core.read_examples(task)
    bos = demo.tok.special_id("<|bos|>")
    assert core.lead_ids(demo) == [bos]
    for index, example in enumerate(examples):
        sequences = [[bos, *demo.tok.encode(f"{example.item['query']} {c}")] for c in example.item["choices"]]
        start = core.common_length(sequences)
        losses, _ = direct_losses(demo, sequences)
        want = [loss[start - 1 :].mean().item() for loss in losses]
        chosen, got, right = core.score_example(demo, task, examples, index, [bos])
        assert got == pytest.approx(want, rel=1e-4)
        assert chosen == want.index(min(want)) and right == (chosen == example.item["gold"])


def test_schema_scores_the_common_suffix_under_each_context(tmp_path, demo):
    task = core.read_tasks(make_bundle(tmp_path))[0][2]
    examples, _ = core.read_examples(task)
    bos = demo.tok.special_id("<|bos|>")
    for index, example in enumerate(examples):
        item = example.item
        sequences = [[bos, *demo.tok.encode(f"{o} {item['continuation']}")] for o in item["context_options"]]
        suffix = core.common_length(sequences, from_end=True)
        losses, _ = direct_losses(demo, sequences)
        want = [loss[len(s) - suffix - 1 :].mean().item() for loss, s in zip(losses, sequences, strict=True)]
        chosen, got, _ = core.score_example(demo, task, examples, index, [bos])
        assert got == pytest.approx(want, rel=1e-4) and chosen == want.index(min(want))


def test_language_modeling_is_right_when_every_greedy_prediction_matches(tmp_path, demo):
    task = core.read_tasks(make_bundle(tmp_path))[0][3]
    examples, _ = core.read_examples(task)
    bos = demo.tok.special_id("<|bos|>")
    for index, example in enumerate(examples):
        without, with_it = core.texts(task, example, core.fewshot_of(examples, index, 1))
        start = len(demo.tok.encode(without)) + 1
        ids = [bos, *demo.tok.encode(with_it)]
        losses, argmax = direct_losses(demo, [ids])
        want = bool(torch.equal(argmax[0][start - 1 :], torch.tensor(ids[start:])))
        _, (loss,), right = core.score_example(demo, task, examples, index, [bos])
        assert right == want and loss == pytest.approx(losses[0][start - 1 :].mean().item(), rel=1e-4)


def test_a_sweep_answers_every_example_at_every_step_and_centers_on_the_baseline(tmp_path):
    task = core.read_tasks(make_bundle(tmp_path))[0][0]
    examples, _ = core.read_examples(task, lite=3)
    points = timeline_of(DEMO).points[:2]
    answers = list(core.core_sweep(points, task, examples))
    assert [(a.step, a.line) for a in answers] == [(p.step, e.line) for p in points for e in examples]
    assert all(a.task == "mc_task" and a.correct == (a.chosen == a.gold) for a in answers)
    share = sum(a.correct for a in answers[:3]) / 3
    assert core.centered(share, 33.3) == pytest.approx((share - 0.333) / (1 - 0.333))
    assert core.core_metric({"mc_task": share}, [task]) == core.centered(share, 33.3)
    assert core.core_metric({}, [task]) is None


def test_hostile_lines_are_named_and_skipped(tmp_path):
    task = core.read_tasks(make_bundle(tmp_path))[0][0]
    rows = [
        MC[0],
        "not json",
        {"query": "q", "choices": ["only"], "gold": 0},
        {"query": "q", "choices": ["a", "b"], "gold": 5},
        {"query": "q", "choices": ["a", 7], "gold": 0},
        {"query": "q", "choices": ["a", "b" * 30_000], "gold": 0},
        {"query": "q", "choices": ["a"] * 1000, "gold": 0},
        {"query": 3, "choices": ["a", "b"], "gold": 0},
        {"query": "q", "choices": ["a", "b"], "gold": True},
        "[" * 100_000,
        MC[1],
    ]
    write_jsonl(task.data, rows)
    examples, problems = core.read_examples(task)
    assert sorted(e.line for e in examples) == [1, 11]
    assert [int(p.split(":")[1]) for p in problems] == list(range(2, 11))
    assert all(p.startswith(f"{task.data}:") and "\n" not in p and len(p) < 300 for p in problems)


def test_a_million_lines_are_read_in_bounded_time_and_say_so(tmp_path):
    task = core.read_tasks(make_bundle(tmp_path))[0][0]
    line = json.dumps(MC[0]) + "\n"
    with task.data.open("w", encoding="utf-8") as f:
        for _ in range(10):
            f.write(line * 100_000)
    examples, problems = core.read_examples(task, lite=5)
    assert len(examples) == 5
    assert problems == [f"{task.data}: only the first {core.MAX_EXAMPLES:,} lines are read"]


def test_a_broken_core_yaml_names_what_it_skips(tmp_path):
    bad = CORE_YAML + (
        "- label: escape\n  dataset_uri: ../../etc/passwd\n  num_fewshot: [0]\n  icl_task_type: schema\n"
        "- label: odd\n  dataset_uri: x.jsonl\n  num_fewshot: [0]\n  icl_task_type: generative\n"
        "- just a string\n"
    )
    bundle = make_bundle(tmp_path, bad)
    tasks, problems = core.read_tasks(bundle)
    assert len(tasks) == 4 and len(problems) == 3
    assert all(p.startswith(f"{bundle / 'core.yaml'}: task ") for p in problems)
    (bundle / "core.yaml").write_text("icl_tasks: [unclosed\n", "utf-8")
    with pytest.raises(FileRefused, match="not valid YAML"):
        core.read_tasks(bundle)
    (bundle / "core.yaml").write_text("- a list\n", "utf-8")
    with pytest.raises(FileRefused, match="no icl_tasks"):
        core.read_tasks(bundle)


def test_a_missing_baseline_file_leaves_tasks_uncentered(tmp_path):
    bundle = make_bundle(tmp_path)
    (bundle / "eval_meta_data.csv").unlink()
    tasks, problems = core.read_tasks(bundle)
    assert all(t.baseline is None for t in tasks) and len(problems) == 1
    assert core.core_metric({t.label: 0.5 for t in tasks}, tasks) is None
