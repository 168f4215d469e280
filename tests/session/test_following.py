"""Following a run's latest step, without Qt: a new step is announced once; only a follower moves
to it, and never in the middle of a reply."""

from pathlib import Path

from desktop.session.following import Following

RUN = Path("/runs/base_checkpoints/d2")
OTHER = Path("/runs/base_checkpoints/d4")


def listed(*steps: int, folder: Path = RUN) -> list[tuple[Path, list[int]]]:
    return [(OTHER, [5, 50]), (folder, list(steps))]


def test_a_new_step_is_announced_once_and_a_talker_that_does_not_follow_stays():
    f = Following()
    f.loaded(RUN, 10)
    assert f.listed(listed(10), replying=False) is None  # its own step is no news
    landing = f.listed(listed(10, 20), replying=False)
    assert landing is not None and (landing.step, landing.following, landing.load_now) == (20, False, False)
    title, message = landing.notice("This chat", "the Step list")
    assert title == "base/d2 step 20 saved" and "Choose it in the Step list" in message
    assert f.listed(listed(10, 20), replying=False) is None  # said once
    assert f.reply_ended() is None and f.step == 10


def test_a_follower_loads_a_new_step_at_once_when_no_reply_streams():
    f = Following()
    f.follow(True)
    f.loaded(RUN, 10)
    landing = f.listed(listed(10, 20), replying=False)
    assert landing is not None and landing.load_now and landing.following
    assert landing.notice("This chat", "the Step list")[1] == (
        "This chat follows the latest step: it answers from now on."
    )


def test_a_reply_streaming_keeps_its_step_and_the_next_one_uses_the_new_step():
    f = Following()
    f.follow(True)
    f.loaded(RUN, 10)
    landing = f.listed(listed(10, 20), replying=True)
    assert landing is not None and not landing.load_now
    assert landing.notice("This chat", "the Step list")[1].endswith("the next reply uses it.")
    assert f.listed(listed(10, 20, 30), replying=True) is not None  # another lands meanwhile
    assert f.reply_ended() == 30  # the newest, once the reply ends
    assert f.reply_ended() is None
    f.loaded(RUN, 30)
    assert f.listed(listed(10, 20, 30), replying=False) is None


def test_following_stops_when_the_user_picks_a_step_and_steps_of_other_runs_are_not_news():
    f = Following()
    f.follow(True)
    f.loaded(RUN, 10)
    assert f.listed(listed(10, folder=OTHER), replying=False) is None
    f.listed(listed(10, 20), replying=True)
    f.follow(False)  # the user picked step 10 itself meanwhile
    assert f.reply_ended() is None
