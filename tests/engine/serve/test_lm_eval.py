"""lm-evaluation-harness against ``nanoscope serve``: its "local-completions" model, with the
server's own tokenizer (``tokenizer_backend=remote``: vLLM's /tokenizer_info, /tokenize and
/detokenize), evaluates a nanochat checkpoint that has no Hugging Face tokenizer.

Two tiny offline tasks over nanochat's golden E7 base checkpoint: a multiple-choice one (each
choice's log-likelihood from an echo request with ``max_tokens`` 1 and ``logprobs`` 1, read from
``token_logprobs[ctxlen:-1]``) and a generate_until one (greedy, stop strings, ``max_gen_toks``).
What lm_eval got is checked against the model itself, opened here in the test: each
log-likelihood is the teacher-forced sum for the ids lm_eval sent, and each generation the
greedy reply to them, cut where a stop string begins. Those ids have no <|bos|> first: the remote
tokenizer asks /tokenize with add_special_tokens false, whatever ``add_bos_token`` says.

Also the least a user writes (no ``model``, no ``tokenizer_backend``): lm_eval sends
``"model": null`` and finds the tokenizer routes itself.
"""

from __future__ import annotations

import json
import math
import threading
from pathlib import Path

import pytest
from support.golden import GOLDEN
from support.serving import serving

from desktop.engine.backend import LoadOptions, Prompt
from desktop.engine.params import SamplingParams
from desktop.engine.registry import open_backend

E7 = GOLDEN / "nanochat" / "E7"
BASE = E7 / "base_checkpoints" / "d2"
CONTEXT = 128  # E7's sequence length
MAX_GEN = 8
UNTIL = ["\n", "."]
BARE_PAIR = ("Paris is", " in France")

DOCS = [
    {"question": "The cat sat on the", "choices": ["mat", "moon", "sky"], "answer": 0, "prompt": "One, two,"},
    # " one" is what the model itself continues this with: one choice lm_eval finds greedy
    {"question": "Once upon a", "choices": ["time", "one"], "answer": 0, "prompt": "The sun is"},
    {"question": "2 + 2 =", "choices": ["4", "5", "22"], "answer": 0, "prompt": "Once upon a"},
    {"question": "Paris is in", "choices": ["France", "Peru"], "answer": 0, "prompt": "Hello"},
]


def _tasks(root: Path) -> None:
    """The data as JSON lines and two task YAMLs beside it (read offline: a local json dataset)."""
    data = root / "docs.jsonl"
    data.write_text("".join(json.dumps(d) + "\n" for d in DOCS), encoding="utf-8")
    source = {
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": str(data)}, "cache_dir": str(root / "hf-cache")},
        "test_split": "test",
    }
    choice = {
        "task": "nanoscope_choice",
        **source,
        "output_type": "multiple_choice",
        "doc_to_text": "{{question}}",
        "doc_to_choice": "choices",
        "doc_to_target": "answer",
        "metric_list": [{"metric": "acc"}],
    }
    generate = {
        "task": "nanoscope_generate",
        **source,
        "output_type": "generate_until",
        "doc_to_text": "{{prompt}}",
        "doc_to_target": " three",
        "generation_kwargs": {"until": UNTIL, "max_gen_toks": MAX_GEN, "do_sample": False},
        "metric_list": [{"metric": "exact_match"}],
    }
    # JSON is YAML: no YAML writer needed, and the strings keep their escapes.
    (root / "choice.yaml").write_text(json.dumps(choice), encoding="utf-8")
    (root / "generate.yaml").write_text(json.dumps(generate), encoding="utf-8")


def _pair(tok, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """The ids lm_eval sends for a (context, continuation) pair (TemplateLM._encode_pair with the
    remote tokenizer, which never adds a BOS): trailing spaces move to the continuation, the
    whole is encoded and split where the context's encoding ends."""
    spaces = len(context) - len(context.rstrip())
    if spaces:
        context, continuation = context[:-spaces], context[-spaces:] + continuation
    whole = tok.encode(context + continuation)
    ctx = tok.encode(context)
    return ctx, whole[len(ctx) :]


def _greedy(backend, ids: list[int], stops: list[str]) -> str:
    """The greedy reply to ``ids`` as the server writes it: the generated tokens' text (a stop
    token adds none), cut where the first stop string begins."""
    tok = backend.tokenizer()
    prompt = Prompt((), tuple(ids), len(ids), CONTEXT)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_GEN)
    out = [
        ev.id
        for ev in backend.stream(prompt, params, threading.Event())
        if not ev.continues and ev.id not in tok.stop_ids
    ]
    text = tok.decode(out)
    cut = min((i for i in (text.find(s) for s in stops) if i >= 0), default=len(text))
    return text[:cut]


def test_lm_eval_local_completions_scores_what_the_model_computes(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")  # before datasets is imported: it reads them once
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import lm_eval
    from lm_eval.api.instance import Instance
    from lm_eval.models.openai_completions import LocalCompletionsAPI
    from lm_eval.tasks import TaskManager

    _tasks(tmp_path)
    options = LoadOptions(device="cpu", base_dir=E7)
    with serving(BASE, options) as s:
        out = lm_eval.simple_evaluate(
            model="local-completions",
            model_args={
                "base_url": f"{s.url}/completions",
                "model": s.model,
                "tokenizer_backend": "remote",
                "tokenized_requests": True,
                "max_length": CONTEXT,
                "num_concurrent": 1,
                "max_retries": 1,
                "timeout": 120,
            },
            tasks=["nanoscope_choice", "nanoscope_generate"],
            task_manager=TaskManager(include_path=str(tmp_path), include_defaults=False),
            log_samples=True,
            bootstrap_iters=0,
        )
        # The least a user writes: no model (sent as null: the served one) and no tokenizer
        # backend (lm_eval finds the remote tokenizer's routes itself).
        bare = LocalCompletionsAPI(base_url=f"{s.url}/completions", max_length=CONTEXT, max_retries=1)
        assert bare.model is None and bare.tokenizer_backend == "remote"
        [(bare_ll, _)] = bare.loglikelihood([Instance("loglikelihood", {}, BARE_PAIR, 0)])
        records = list(s.records)
    assert out is not None
    assert all(r.status == 200 for r in records), [r for r in records if r.status != 200]

    backend = open_backend(BASE, options)
    try:
        tok = backend.tokenizer()
        eos = backend.token_label(min(tok.stop_ids))  # what /tokenizer_info calls eos_token

        choice = out["samples"]["nanoscope_choice"]
        assert len(choice) == len(DOCS)
        scored = greedy = 0
        for sample in choice:
            assert len(sample["resps"]) == len(sample["doc"]["choices"])
            for args, resp in zip(sample["arguments"], sample["resps"], strict=True):
                context, continuation = args
                ctx, cont = _pair(tok, context, continuation)
                assert ctx and cont
                want = backend.score(Prompt((), tuple(ctx), len(ctx), CONTEXT), cont, top=1)
                got, is_greedy = resp[0]
                assert got == pytest.approx(sum(want["token_logprobs"]), abs=1e-5), (context, continuation)
                # lm_eval's is_greedy: each token's log-probability is the best in its top_logprobs
                best = [top[0][0] for top in want["top"]]
                assert is_greedy == (best == cont), (context, continuation)
                greedy += is_greedy
                scored += 1
        assert scored == sum(len(d["choices"]) for d in DOCS)
        assert greedy >= 1
        assert isinstance(out["results"]["nanoscope_choice"]["acc,none"], float)

        generated = out["samples"]["nanoscope_generate"]
        assert len(generated) == len(DOCS)
        for sample in generated:
            context, _gen_kwargs = sample["arguments"][0]
            ids = tok.encode(context)
            assert sample["resps"][0][0] == _greedy(backend, ids, [*UNTIL, eos]), context
        assert math.isfinite(out["results"]["nanoscope_generate"]["exact_match,none"])

        ctx, cont = _pair(tok, *BARE_PAIR)
        want = backend.score(Prompt((), tuple(ctx), len(ctx), CONTEXT), cont)["token_logprobs"]
        assert bare_ll == pytest.approx(sum(want), abs=1e-5)
    finally:
        backend.close()
