"""What ``torch.save(module.state_dict())`` writes passes the pickle pre-scan and loads exactly;
nothing more than that passes.

``nn.Module.state_dict()`` returns an OrderedDict carrying ``_metadata`` (each module's
version), which pickle writes as BUILD on the OrderedDict. Every checkpoint a training script
writes has that shape; the scan once refused it, and no test saw, because the tests wrote flat
dicts. Here the files are written by torch itself from real module trees (Linear, Embedding,
nested Sequential/ModuleList, parameters and buffers of every dtype nanochat stores), in the zip
format and the legacy stream, and through torch.compile's wrapper (``_orig_mod.`` keys), and the
project's own GPT for every era the factory writes.
"""

from __future__ import annotations

import collections
import io
import pickle
import tempfile
import zipfile
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import hostile_corpus as hostile
from support.checkpoint_factory import ERAS, write_checkpoint
from torch import nn

from desktop.engine.errors import CheckpointError
from desktop.engine.files.pickle_scan import PickleRefused
from desktop.engine.files.torch_files import scan_torch_file
from desktop.engine.nanochat.checkpoint import COMPILE_PREFIX, load_state_dict, model_file
from desktop.engine.nanochat.loader import load_model

# What nanochat checkpoints store: fp32 master weights, bf16 embeddings on CUDA, the fork's fp16/bf16.
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
dims = st.integers(1, 6)
dtypes = st.sampled_from(DTYPES)


class Holder(nn.Module):
    """A module with a parameter and a buffer of its own (nanochat's lambdas and gates)."""

    def __init__(self, shape: tuple[int, ...], dtype: torch.dtype, buffer: bool) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(shape).to(dtype))
        if buffer:
            self.register_buffer("table", torch.randn(shape).to(dtype))


def leaves() -> st.SearchStrategy[nn.Module]:
    return st.one_of(
        st.builds(lambda i, o, b, d: nn.Linear(i, o, bias=b).to(d), dims, dims, st.booleans(), dtypes),
        st.builds(lambda n, d, t: nn.Embedding(n, d).to(t), dims, dims, dtypes),
        st.builds(Holder, st.lists(dims, min_size=1, max_size=3).map(tuple), dtypes, st.booleans()),
    )


def trees(children: st.SearchStrategy[nn.Module]) -> st.SearchStrategy[nn.Module]:
    return st.one_of(
        st.lists(children, min_size=1, max_size=3).map(lambda ms: nn.Sequential(*ms)),
        st.lists(children, min_size=1, max_size=3).map(nn.ModuleList),
        st.dictionaries(st.sampled_from(["h", "wte", "attn", "mlp"]), children, min_size=1).map(
            nn.ModuleDict
        ),
    )


modules = st.recursive(leaves(), trees, max_leaves=8)


def save(module: nn.Module, path: Path, *, legacy: bool, compiled: bool) -> dict[str, torch.Tensor]:
    """Save ``module``'s state dict as a training script would; returns what was saved."""
    owner = torch.compile(module) if compiled else module  # OptimizedModule: '_orig_mod.' keys
    sd = owner.state_dict()
    torch.save(sd, path, _use_new_zipfile_serialization=not legacy)
    return sd


@settings(max_examples=120, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(module=modules, legacy=st.booleans(), compiled=st.booleans())
def test_any_module_trees_state_dict_passes_the_scan_and_loads_exactly(module, legacy, compiled):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model_000001.pt"
        saved = save(module, path, legacy=legacy, compiled=compiled)
        assert hasattr(saved, "_metadata")  # the shape every real checkpoint has

        scan = scan_torch_file(path)
        assert (scan.top, scan.legacy) == ("dict", legacy)
        described = dict(scan.entries)
        assert list(described) == list(saved)
        for key, tensor in saved.items():
            info = described[key]
            assert (info.dtype, info.shape) == (str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape))

        loaded = load_state_dict(path)
        assert list(loaded) == [k.removeprefix(COMPILE_PREFIX) for k in saved]
        for key, tensor in saved.items():
            got = loaded[key.removeprefix(COMPILE_PREFIX)]
            assert got.dtype == tensor.dtype and torch.equal(got, tensor)


@pytest.mark.parametrize("legacy", [False, True])
def test_a_checkpoint_in_the_legacy_format_loads_like_the_zip_one(tmp_path, legacy):
    ckpt = write_checkpoint(tmp_path, "E7", tokenizer=None)
    path = model_file(ckpt, 10)
    reference = load_state_dict(path, mmap=False)  # not mapped: the file is rewritten below
    torch.save(torch.load(path, weights_only=True), path, _use_new_zipfile_serialization=not legacy)
    assert zipfile.is_zipfile(path) is not legacy
    model = load_model(ckpt, device="cpu").model
    for key, tensor in reference.items():
        assert torch.equal(model.state_dict()[key], tensor)


# --- what is still refused ----------------------------------------------------------------------


def _with_state(state: dict) -> collections.OrderedDict:
    sd = collections.OrderedDict(w=torch.zeros(2))
    sd.__dict__.update(state)
    return sd


@pytest.mark.parametrize(
    ("state", "says"),
    [
        ({"_metadata": collections.OrderedDict({"": {"version": 1}}), "hook": "x"}, "other than '_metadata'"),
        ({"extra": 1}, "other than '_metadata'"),
        ({"_metadata": collections.OrderedDict({"": {"version": "1"}})}, "integer fields"),
        ({"_metadata": collections.OrderedDict({"": [1, 2]})}, "integer fields"),
        ({"_metadata": collections.OrderedDict({"": {f"k{i}": i for i in range(9)}})}, "integer fields"),
        ({"_metadata": [("", {"version": 1})]}, "not a table"),
    ],
)
def test_only_a_state_dicts_own_metadata_may_be_set(tmp_path, state, says):
    path = tmp_path / "model_000001.pt"
    torch.save(_with_state(state), path)
    with pytest.raises(PickleRefused, match=says) as info:
        scan_torch_file(path)
    assert info.value.kind == "construct"


def test_build_on_a_plain_dict_is_refused_naming_the_construct_and_the_file(tmp_path):
    ckpt = write_checkpoint(tmp_path, "E7", tokenizer=None)
    # A plain dict (not an OrderedDict) whose state is set: no torch.save writes that.
    state = b"}" + hostile.short_unicode("_metadata") + b"}s"
    path = hostile.replace_model(ckpt, b"}" + state + b"b")
    with pytest.raises(CheckpointError) as info:
        load_model(ckpt, device="cpu")
    assert str(info.value) == (
        f"{path}: refused to load: it sets attributes on a dict (pickle BUILD); a saved state dict "
        "sets only the '_metadata' of its OrderedDict"
    )


def test_a_second_build_on_the_same_ordered_dict_is_refused(tmp_path):
    sd = collections.OrderedDict()
    sd.__dict__["_metadata"] = collections.OrderedDict({"": {"version": 1}})
    data = pickle.dumps(sd, protocol=2)
    assert data.startswith(hostile.PROTO) and data.endswith(b"b.")
    again = data[2:-1] + b"}" + hostile.short_unicode("_metadata") + b"}s" + b"b"
    path = hostile.write_torch_zip(tmp_path / "model_000001.pt", again)
    with pytest.raises(PickleRefused, match="sets attributes on a dict"):
        scan_torch_file(path)


def _legacy_file(tmp_path: Path) -> tuple[Path, bytes]:
    path = tmp_path / "model_000001.pt"
    torch.save(nn.Linear(3, 2).state_dict(), path, _use_new_zipfile_serialization=False)
    return path, path.read_bytes()


def test_a_cut_off_legacy_file_is_refused(tmp_path):
    path, data = _legacy_file(tmp_path)
    path.write_bytes(data[:-5])
    with pytest.raises(PickleRefused, match="runs past the end of the file"):
        scan_torch_file(path)


def test_a_legacy_storage_of_another_size_than_declared_is_refused(tmp_path):
    path, data = _legacy_file(tmp_path)
    bias_count = (2).to_bytes(8, "little")  # the last storage: the 2-element bias
    at = data.rindex(bias_count)
    path.write_bytes(data[:at] + (10**9).to_bytes(8, "little") + data[at + 8 :])
    with pytest.raises(PickleRefused, match="holds another size than its tensor declares"):
        scan_torch_file(path)


def test_a_pickle_that_is_not_a_torch_file_is_refused(tmp_path):
    path = tmp_path / "model_000001.pt"
    path.write_bytes(pickle.dumps(12345, protocol=2) * 4)
    with pytest.raises(PickleRefused, match="not a torch checkpoint"):
        scan_torch_file(path)


def test_code_after_a_legacy_header_never_runs(tmp_path):
    marker = tmp_path / "pwned"
    path, data = _legacy_file(tmp_path)
    # Keep torch's three header pickles, then a pickle that calls os.system.
    stream = io.BytesIO(data)
    for _ in range(3):
        pickle.load(stream)  # plain values, written by torch a moment ago
    header_end = stream.tell()
    path.write_bytes(data[:header_end] + hostile.code_payload(marker))
    with pytest.raises(PickleRefused) as info:
        scan_torch_file(path)
    assert (info.value.kind, info.value.name) == ("global", "os.system")
    assert not marker.exists()


@pytest.mark.parametrize(
    ("legacy", "dtype"),
    [(False, torch.float32), (True, torch.bfloat16), (False, torch.float16)],
    ids=["zip-fp32", "legacy-bf16", "zip-fp16"],
)
@pytest.mark.parametrize("era", ERAS)
def test_our_own_gpt_of_every_era_saves_what_the_scan_passes(tmp_path, era, legacy, dtype):
    """The project's GPT, built for each era and cast as a run may keep it, saved as a training
    script saves it: the scan passes it and it loads with identical bits."""
    ckpt = write_checkpoint(tmp_path, era, tokenizer=None)
    saved = load_model(ckpt, device="cpu").model.to(dtype).state_dict()
    assert hasattr(saved, "_metadata") and {t.dtype for t in saved.values()} == {dtype}
    path = tmp_path / "model_000001.pt"
    torch.save(saved, path, _use_new_zipfile_serialization=not legacy)
    assert list(dict(scan_torch_file(path).entries)) == list(saved)
    loaded = load_state_dict(path, mmap=False)
    assert list(loaded) == list(saved)
    assert all(loaded[k].dtype == t.dtype and torch.equal(loaded[k], t) for k, t in saved.items())
