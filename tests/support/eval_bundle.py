"""A small eval_bundle in nanochat's layout (core.yaml, eval_meta_data.csv, eval_data/*.jsonl),
with one task of each kind core_eval scores, for tests of the CORE sweep and the CLI."""

from __future__ import annotations

import json
from pathlib import Path

MC = [
    {"query": "The capital of France is", "choices": ["Paris", "Rome", "a dog"], "gold": 0},
    {"query": "Two plus two is", "choices": ["four", "seven"], "gold": 0},
    {"query": "The sky is", "choices": ["blue", "loud", "square"], "gold": 0},
    {"query": "Water is", "choices": ["wet", "dry"], "gold": 0},
]
SCHEMA = [
    {"context_options": ["The cat sat on the mat.", "The mat sat on the cat."], "continuation": "It purred."},
    {"context_options": ["Ice is cold.", "Ice is hot."], "continuation": "So it melts in the sun."},
]
SCHEMA = [{**row, "gold": 0} for row in SCHEMA]
LM = [
    {"context": "The capital of France is ", "continuation": "Paris"},
    {"context": "One, two, three, four,", "continuation": "five"},
    {"context": "Hello", "continuation": " world"},
]
CORE_YAML = """\
icl_tasks:
- label: mc_task
  dataset_uri: world/mc.jsonl
  num_fewshot: [0]
  icl_task_type: multiple_choice
- label: mc_fewshot
  dataset_uri: world/mc.jsonl
  num_fewshot: [2]
  icl_task_type: multiple_choice
  continuation_delimiter: "\\nAnswer: "
- label: schema_task
  dataset_uri: schema.jsonl
  num_fewshot: [0]
  icl_task_type: schema
- label: lm_task
  dataset_uri: lm.jsonl
  num_fewshot: [1]
  icl_task_type: language_modeling
"""


def write_jsonl(path: Path, rows: list) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), "utf-8")
    return path


def make_bundle(base: Path, yaml_text: str = CORE_YAML) -> Path:
    """An eval_bundle in nanochat's layout: core.yaml, eval_meta_data.csv, eval_data/."""
    bundle = base / "eval_bundle"
    bundle.mkdir(parents=True)
    (bundle / "core.yaml").write_text(yaml_text, "utf-8")
    (bundle / "eval_meta_data.csv").write_text(
        "Eval Task,Task Category,Random baseline\nmc_task,world,33.3\nmc_fewshot,world,33.3\n"
        "schema_task,commonsense,50\nlm_task,language,0\n",
        "utf-8",
    )
    write_jsonl(bundle / "eval_data" / "world" / "mc.jsonl", MC)
    write_jsonl(bundle / "eval_data" / "schema.jsonl", SCHEMA)
    write_jsonl(bundle / "eval_data" / "lm.jsonl", LM)
    return bundle
