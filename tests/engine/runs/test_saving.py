"""A step is offered once its files are whole and settled, shown as saving until then, and as
incomplete (with its reason) when it never finishes. The files are the real tools' (the golden
corpus), written into a folder piece by piece in each tool's own order."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from desktop.engine.discovery import discover
from desktop.engine.errors import NanoscopeError
from desktop.engine.nanochat import checkpoint as ckpt
from desktop.engine.runs.saving import INCOMPLETE, SAVED, SAVING, SaveWatch, StillWriting, read_unchanged

GOLDEN = Path(__file__).parents[2] / "golden"
NANOCHAT = GOLDEN / "nanochat" / "E7" / "base_checkpoints" / "d2"
KF_RUN = GOLDEN / "kempnerforge" / "dense-gqa-qknorm" / "run"
HF = GOLDEN / "transformers" / "llama-sharded"


class Clock:
    """The watch's time source, moved by the test (no sleeps)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


def states(watch: SaveWatch, folder: Path) -> dict[int, tuple[str, str]]:
    return {s.step: (s.state, s.reason) for s in watch.nanochat(folder)}


def write_part(source: Path, target: Path, fraction: float) -> None:
    data = source.read_bytes()
    target.write_bytes(data[: int(len(data) * fraction)])


def test_steps_on_disk_before_the_first_look_are_saved_at_once(tmp_path, clock):
    folder = tmp_path / "base_checkpoints" / "d2"
    shutil.copytree(NANOCHAT, folder)
    watch = SaveWatch(clock=clock)
    assert states(watch, folder) == {10: (SAVED, "")}
    assert [(e.source, e.steps, e.unsaved) for e in discover(tmp_path, saves=SaveWatch())] == [
        ("base", [10], [])
    ]


def test_a_nanochat_step_is_offered_only_after_model_then_meta_are_whole_and_settled(tmp_path, clock):
    folder = tmp_path / "base_checkpoints" / "d2"
    shutil.copytree(NANOCHAT, folder)
    watch = SaveWatch(settle_s=1.0, clock=clock)
    states(watch, folder)  # the first look: step 10 was there
    model, meta = folder / "model_000020.pt", folder / "meta_000020.json"
    # save_checkpoint's order: the model (torch's zip, its end record last), then the meta.
    write_part(NANOCHAT / "model_000010.pt", model, 0.5)
    assert states(watch, folder)[20] == (SAVING, "model_000020.pt is cut short")
    shutil.copyfile(NANOCHAT / "model_000010.pt", model)
    clock.now += 0.5
    assert states(watch, folder)[20] == (SAVING, "meta_000020.json is not written")
    write_part(NANOCHAT / "meta_000010.json", meta, 0.5)
    assert states(watch, folder)[20] == (SAVING, "meta_000020.json is not whole JSON")
    shutil.copyfile(NANOCHAT / "meta_000010.json", meta)
    assert states(watch, folder)[20][0] == SAVING  # whole, but just changed
    entry = discover(tmp_path, saves=watch)[0]
    assert entry.steps == [10] and [s.step for s in entry.unsaved] == [20]
    clock.now += 1.0
    assert states(watch, folder)[20] == (SAVED, "")
    assert discover(tmp_path, saves=watch)[0].steps == [10, 20]


def test_a_step_that_changes_again_waits_to_settle_again(tmp_path, clock):
    folder = tmp_path / "d2"
    folder.mkdir()
    watch = SaveWatch(settle_s=1.0, clock=clock)
    states(watch, folder)
    shutil.copyfile(NANOCHAT / "model_000010.pt", folder / "model_000010.pt")
    shutil.copyfile(NANOCHAT / "meta_000010.json", folder / "meta_000010.json")
    assert states(watch, folder)[10][0] == SAVING
    clock.now += 0.9
    with open(folder / "meta_000010.json", "a") as f:  # rewritten meanwhile (still whole JSON)
        f.write("\n")
    assert states(watch, folder)[10][0] == SAVING
    clock.now += 0.9
    assert states(watch, folder)[10][0] == SAVING  # 0.9 s since the last change
    clock.now += 0.2
    assert states(watch, folder)[10][0] == SAVED


def test_a_save_that_never_finishes_is_incomplete_with_its_reason(tmp_path, clock):
    folder = tmp_path / "base_checkpoints" / "d2"
    shutil.copytree(NANOCHAT, folder)
    watch = SaveWatch(settle_s=1.0, give_up_s=30.0, clock=clock)
    states(watch, folder)
    write_part(NANOCHAT / "model_000010.pt", folder / "model_000020.pt", 0.3)  # the writer died here
    assert states(watch, folder)[20][0] == SAVING
    clock.now += 29.0
    assert states(watch, folder)[20][0] == SAVING
    clock.now += 1.0
    assert states(watch, folder)[20] == (INCOMPLETE, "model_000020.pt is cut short")
    entry = discover(tmp_path, saves=watch)[0]
    assert entry.steps == [10]
    assert [(s.step, s.state, s.label()) for s in entry.unsaved] == [(20, INCOMPLETE, "step 20 · incomplete")]


def test_an_unfinished_step_a_later_saved_step_overtook_is_incomplete_at_once(tmp_path, clock):
    folder = tmp_path / "d2"
    folder.mkdir()
    write_part(NANOCHAT / "model_000010.pt", folder / "model_000005.pt", 0.3)
    shutil.copyfile(NANOCHAT / "model_000010.pt", folder / "model_000010.pt")
    shutil.copyfile(NANOCHAT / "meta_000010.json", folder / "meta_000010.json")
    found = states(SaveWatch(clock=clock), folder)
    assert found == {5: (INCOMPLETE, "model_000005.pt is cut short"), 10: (SAVED, "")}


def test_an_old_unfinished_step_found_at_the_first_look_is_incomplete_by_its_files_age(tmp_path, clock):
    folder = tmp_path / "d2"
    folder.mkdir()
    model = folder / "model_000010.pt"
    shutil.copyfile(NANOCHAT / "model_000010.pt", model)
    assert states(SaveWatch(give_up_s=60.0, clock=clock), folder)[10][0] == SAVING  # just written
    old = time.time() - 3600
    os.utime(model, (old, old))
    assert states(SaveWatch(give_up_s=60.0, clock=clock), folder)[10] == (
        INCOMPLETE,
        "meta_000010.json is not written",
    )


def test_a_saved_step_is_not_read_again_while_its_files_are_unchanged(tmp_path, clock):
    folder = tmp_path / "d2"
    shutil.copytree(NANOCHAT, folder)
    watch = SaveWatch(clock=clock)
    assert states(watch, folder)[10][0] == SAVED
    meta = folder / "meta_000010.json"
    stat = meta.stat()
    meta.chmod(0)  # unreadable now: a second look that read it would say so
    try:
        assert states(watch, folder)[10][0] == SAVED
    finally:
        meta.chmod(stat.st_mode)


def kf_copy(run: Path, step: int, parts: tuple[str, ...]) -> None:
    source = KF_RUN / f"step_{step}"
    target = run / f"step_{step}"
    target.mkdir(parents=True, exist_ok=True)
    for name in parts:
        shutil.copyfile(source / name, target / name)


def test_a_kempnerforge_step_is_offered_once_dcp_wrote_its_metadata(tmp_path, clock):
    run = tmp_path / "run"
    kf_copy(run, 120, ("__0_0.distcp", ".metadata", "metadata.json"))
    watch = SaveWatch(settle_s=1.0, clock=clock)
    assert [(s.step, s.state) for s in watch.kempnerforge(run)] == [(120, SAVED)]
    kf_copy(run, 240, ("__0_0.distcp",))  # the shards first
    assert {s.step: (s.state, s.reason) for s in watch.kempnerforge(run)}[240] == (
        SAVING,
        "step_240 has no .metadata yet (DCP writes it last)",
    )
    entry = discover(tmp_path, saves=watch)[0]
    assert (entry.source, entry.steps, [s.step for s in entry.unsaved]) == ("kempnerforge", [120], [240])
    kf_copy(run, 240, (".metadata",))
    assert {s.step: s.state for s in watch.kempnerforge(run)}[240] == SAVING  # just landed
    clock.now += 1.0
    assert [(s.step, s.state) for s in watch.kempnerforge(run)] == [(120, SAVED), (240, SAVED)]
    assert discover(tmp_path, saves=watch)[0].steps == [120, 240]


def test_a_hugging_face_folder_being_rewritten_is_not_offered_until_whole(tmp_path, clock):
    folder = tmp_path / "llama"
    shutil.copytree(HF, folder)
    watch = SaveWatch(settle_s=1.0, clock=clock)
    assert watch.hf(folder).state == SAVED
    shard = folder / "model-00003-of-00006.safetensors"
    write_part(HF / shard.name, shard, 0.6)  # save_pretrained is rewriting it
    state = watch.hf(folder)
    assert state.state == SAVING and "model-00003-of-00006.safetensors" in state.reason
    assert [e.source for e in discover(tmp_path, saves=watch)] == []
    shutil.copyfile(HF / shard.name, shard)
    clock.now += 1.0
    assert watch.hf(folder).state == SAVING  # whole again, but changed since the last look
    clock.now += 1.0
    assert watch.hf(folder).state == SAVED
    assert [e.source for e in discover(tmp_path, saves=watch)] == ["hf"]


class Writer:
    """Writes a real file in ``parts`` pieces, one each time it is asked (a save in progress)."""

    def __init__(self, source: Path, target: Path, parts: int) -> None:
        self.data, self.target, self.parts, self.done = source.read_bytes(), target, parts, 0

    def more(self, _seconds: float = 0.0) -> None:
        self.done = min(self.parts, self.done + 1)
        self.target.write_bytes(self.data[: len(self.data) * self.done // self.parts])


def test_a_file_that_changes_while_it_is_read_is_read_again_not_called_corrupt(tmp_path):
    folder = tmp_path / "d2"
    folder.mkdir()
    shutil.copyfile(NANOCHAT / "meta_000010.json", folder / "meta_000010.json")
    model = folder / "model_000010.pt"
    writer = Writer(NANOCHAT / "model_000010.pt", model, 3)
    writer.more()
    waits: list[float] = []

    def read():
        writer.more()  # the save goes on while the file is read
        return ckpt.tensor_shapes(model)

    shapes = read_unchanged(read, folder, 10, wait=waits.append)
    assert shapes == ckpt.tensor_shapes(NANOCHAT / "model_000010.pt") and len(waits) == 1


def test_a_file_cut_short_and_left_so_says_what_it_is(tmp_path):
    folder = tmp_path / "d2"
    folder.mkdir()
    write_part(NANOCHAT / "model_000010.pt", folder / "model_000010.pt", 0.5)
    with pytest.raises(NanoscopeError) as raised:
        read_unchanged(
            lambda: ckpt.tensor_shapes(folder / "model_000010.pt"), folder, 10, wait=lambda _s: None
        )
    assert not isinstance(raised.value, StillWriting)


def test_a_file_that_never_stops_changing_is_said_to_be_written(tmp_path):
    folder = tmp_path / "d2"
    folder.mkdir()
    writer = Writer(NANOCHAT / "model_000010.pt", folder / "model_000010.pt", 10)

    def read():
        writer.more()
        return ckpt.tensor_shapes(folder / "model_000010.pt")

    with pytest.raises(StillWriting, match="changed while they were read"):
        read_unchanged(read, folder, 10, wait=lambda _s: None, attempts=3)
