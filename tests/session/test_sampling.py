"""The sampling state without Qt: validated values, a locked seed that repeats, and unlocked seeds
that stay fresh whatever reseeds the global ``random`` module."""

import random

import pytest

from desktop.engine.params import SamplingParams
from desktop.session.sampling import DEFAULTS, SEED_MAX, SamplingState, draw_seed

VALUES = {
    "temperature": 1.35,
    "top_k": 17,
    "top_p": 0.9,
    "min_p": 0.05,
    "repetition_penalty": 1.2,
    "max_tokens": 300,
    "seed": 987,
    "seed_locked": False,
    "system_prompt": "Be brief.",
}


def test_values_round_trip_and_notify_once_per_change():
    state = SamplingState()
    assert state.values() == DEFAULTS
    seen: list = []
    state.events.changed.connect(seen.append)
    assert state.update(VALUES)
    assert state.values() == VALUES and seen == [VALUES]
    assert not state.update(VALUES)  # nothing changed: nothing said
    assert seen == [VALUES]
    other = SamplingState()
    other.update(state.values())
    assert other.values() == VALUES


@pytest.mark.parametrize(
    "bad",
    [
        {"temperature": -1.0},
        {"top_p": 0.0},
        {"top_k": 2.5},
        {"max_tokens": 0},
        {"seed": -1},
        {"seed_locked": "yes"},
        {"system_prompt": 3},
        {"colour": "red"},
    ],
)
def test_an_invalid_value_is_refused_and_changes_nothing(bad):
    state = SamplingState()
    state.update(VALUES)
    seen: list = []
    state.events.changed.connect(seen.append)
    with pytest.raises(ValueError):
        state.update({"temperature": 0.5, **bad})
    assert state.values() == VALUES and seen == []


def test_a_locked_seed_repeats_and_the_request_carries_it():
    state = SamplingState()
    state.update({**VALUES, "seed": 5, "seed_locked": True})
    requests = [state.next_request() for _ in range(3)]
    assert requests == [(SamplingParams.from_dict({**VALUES, "seed": 5}), "Be brief.")] * 3


def test_unlocked_seeds_are_fresh_even_when_the_global_random_is_reseeded():
    state = SamplingState()
    state.update({"seed_locked": False})
    seeds = []
    for _ in range(1000):
        random.seed(0)  # as a library might: the seed source must not follow it
        params, _ = state.next_request()
        assert params.seed == state.values()["seed"]  # the reply's seed is the one shown
        assert 0 <= params.seed <= SEED_MAX
        seeds.append(params.seed)
    assert len(set(seeds)) == 1000


def test_the_dice_and_compare_draw_from_the_same_source():
    random.seed(0)
    first = draw_seed()
    random.seed(0)
    assert draw_seed() != first
    state = SamplingState()
    state.update({"seed": 7, "seed_locked": True})
    seed = state.new_seed()
    assert state.values()["seed"] == seed and state.next_request()[0].seed == seed
