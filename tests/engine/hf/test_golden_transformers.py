"""Hugging Face folders written by transformers' own ``save_pretrained`` reproduce transformers' own
greedy ids: plain prompts (``tokenizer(text)``), a chat rendered by the saved template, a model
saved in bfloat16, and one split over six safetensors shards.

tests/golden/transformers/<case>/ was made by ``python -m tools.golden transformers``; golden.json
holds ``generate(do_sample=False)``'s ids and the versions that made them.
"""

from __future__ import annotations

import json

import pytest
from support.backend_helpers import reply_ids
from support.golden import GOLDEN, assert_files_as_written, manifest

from desktop.cli import main as cli
from desktop.engine.backend import LoadOptions
from desktop.engine.hf.backend import HFBackend
from desktop.engine.messages import Message
from desktop.engine.params import SamplingParams
from desktop.engine.registry import open_backend

CASES = sorted(p.parent for p in (GOLDEN / "transformers").glob("*/golden.json"))


def test_there_are_golden_folders_and_one_is_sharded():
    assert len(CASES) >= 3
    assert any(len(list(case.glob("model-*-of-*.safetensors"))) > 1 for case in CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_the_files_are_the_ones_transformers_wrote(case):
    assert_files_as_written(case)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_the_backend_reproduces_generate(case):
    m = manifest(case)
    backend = open_backend(case, LoadOptions(device="cpu", dtype="float32"))
    assert isinstance(backend, HFBackend)
    try:
        for c in m["expected"]:
            conversation = [Message.of_text("user", c["text"])] if c["chat"] else c["text"]
            prompt = backend.render(conversation, None)
            assert list(prompt.ids) == c["prompt_ids"], c["text"]
            greedy = SamplingParams(temperature=0.0, max_tokens=m["max_new_tokens"])
            assert reply_ids(backend, prompt, greedy) == c["greedy"], c["text"]
    finally:
        backend.close()


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_nanoscope_generate_reproduces_the_greedy_ids(case, capsys):
    m = manifest(case)
    c = next(c for c in m["expected"] if not c["chat"])
    argv = ["generate", str(case), "--prompt", c["text"], "--temperature", "0"]
    argv += ["--max-tokens", str(m["max_new_tokens"]), "--device", "cpu", "--dtype", "float32", "--json"]
    assert cli.main(argv) == 0
    done = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert done["prompt_ids"] == c["prompt_ids"]
    assert done["ids"] == c["greedy"]
