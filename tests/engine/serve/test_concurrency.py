"""Several clients at once: replies decoded side by side, a token of each in turn, are exactly the
replies each gets alone (no reply writes another's cache), and a short request is answered while a
long one is still streaming, not after it."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from support.golden import GOLDEN
from support.serving import serving

from desktop.engine.backend import LoadOptions

E7 = GOLDEN / "nanochat" / "E7"
BASE = E7 / "base_checkpoints" / "d2"
PROMPTS = ["The cat sat", "Once upon a time", "One, two,", "Hello there, my friend"]


def ids_of(client, model: str, prompt: str, seed: int, max_tokens: int = 24) -> list[int]:
    r = client.completions.create(
        model=model,
        prompt=prompt,
        max_tokens=max_tokens,
        temperature=1.0,
        seed=seed,
        extra_body={"return_token_ids": True},
    )
    return r.choices[0].model_extra["token_ids"]


# Every family's own cache, written beside others: nanochat's, transformers' Llama, KempnerForge's.
FAMILIES = {
    "nanochat": (BASE, E7),
    "transformers": (GOLDEN / "transformers" / "llama-bf16", None),
    "kempnerforge": (GOLDEN / "kempnerforge" / "dense-gqa-qknorm" / "run", None),
}


@pytest.mark.parametrize("family", FAMILIES)
def test_concurrent_replies_equal_the_replies_sent_alone(family):
    directory, base = FAMILIES[family]
    with serving(directory, LoadOptions(device="cpu", base_dir=base)) as s:
        client = s.openai()
        alone = [ids_of(client, s.model, p, seed) for seed, p in enumerate(PROMPTS * 2)]
        with ThreadPoolExecutor(len(alone)) as pool:
            together = list(
                pool.map(lambda a: ids_of(s.openai(), s.model, a[1], a[0]), enumerate(PROMPTS * 2))
            )
        assert together == alone
        # A follow-up alone again reuses the kept cache and still answers the same.
        assert ids_of(client, s.model, PROMPTS[0], 0) == alone[0]


def test_a_short_request_is_answered_while_a_long_one_streams():
    with serving(BASE, LoadOptions(device="cpu", base_dir=E7)) as s:
        client = s.openai()
        long_body = {
            "model": s.model,
            "prompt": "The cat sat",
            "max_tokens": 100,
            "temperature": 1.0,
            "seed": 0,
        }
        assert (
            client.completions.create(**long_body).choices[0].finish_reason == "length"
        )  # 100 tokens, seeded
        short_done = threading.Event()
        chunks_after_short: list[str] = []
        started = threading.Event()

        def ask_short() -> None:
            started.wait(60)
            client.completions.create(model=s.model, prompt="Hello", max_tokens=1, temperature=0)
            short_done.set()

        worker = threading.Thread(target=ask_short)
        worker.start()
        for chunk in client.completions.create(**long_body, stream=True):
            started.set()  # the long reply streams: now the short request comes
            if short_done.is_set() and chunk.choices and chunk.choices[0].text:
                chunks_after_short.append(chunk.choices[0].text)
        worker.join(60)
        assert short_done.is_set()
        # The short answer came while the long reply still had tokens to send.
        assert chunks_after_short


def test_a_streamed_batch_with_a_refused_prompt_is_one_error_before_any_byte():
    import httpx

    with serving(BASE, LoadOptions(device="cpu", base_dir=E7)) as s:
        body = {"model": s.model, "prompt": [[1, 2, 3], [4, 100000]], "max_tokens": 4, "stream": True}
        r = httpx.post(f"{s.url}/completions", json=body, timeout=60)
        assert r.status_code == 400
        assert r.headers["content-type"].startswith("application/json")
        assert "out of range" in r.json()["error"]["message"]


def test_short_replies_are_decoded_side_by_side_past_four():
    """Five replies of 100 tokens fit the model's side-by-side budget (four contexts of positions):
    each has its first token before any of them has its last."""
    with serving(BASE, LoadOptions(device="cpu", base_dir=E7)) as s:
        bos = int(
            httpx.post(f"{s.root}/tokenize", json={"prompt": "<|bos|>"}, timeout=30).json()["tokens"][0]
        )
        body = {"model": s.model, "prompt": [bos], "max_tokens": 100, "temperature": 1.0, "seed": 2}
        assert s.openai().completions.create(**body).usage.completion_tokens == 100
        firsts: list[int] = []
        lasts: list[int] = []
        order = iter(range(10**6))
        lock = threading.Lock()

        def stream() -> None:
            seen = False
            for chunk in s.openai().completions.create(**body, stream=True):
                if chunk.choices and chunk.choices[0].text and not seen:
                    seen = True
                    with lock:
                        firsts.append(next(order))
            with lock:
                lasts.append(next(order))

        threads = [threading.Thread(target=stream) for _ in range(5)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert len(firsts) == len(lasts) == 5
        assert max(firsts) < min(lasts)
