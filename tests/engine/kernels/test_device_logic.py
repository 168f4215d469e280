"""Device and precision rules against faked hardware, and no CPU-only kernel off the CPU.

No GPU has been available to this project, so the CUDA and MPS paths are kept correct by design:

* the device and precision choices run against faked capabilities (torch's CUDA and MPS queries
  and fbgemm's presence monkeypatched): an H100 (SM90), an A100 (SM80), a T4 (SM75), MPS with
  and without bf16, an x86 CPU with fbgemm and an arm64 CPU without;
* models of every era are prepared and run on the ``meta`` device, which holds no values. Every
  torch call is watched for what CUDA and MPS refuse, a CPU tensor (other than a 0-dim scalar)
  beside a device tensor (meta itself lets products through): a CPU-only kernel, a KV cache or
  rotary table left on the CPU, or a probe made on the CPU would show there.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from support.checkpoint_factory import ERAS, default_config, make_meta, make_state_dict
from torch.overrides import TorchFunctionMode

from desktop.engine.decode.kvcache import KVCache
from desktop.engine.errors import DeviceError
from desktop.engine.kernels import gemv
from desktop.engine.kernels.device import (
    DEVICES,
    PRECISIONS,
    Hardware,
    choose_precision,
    describe_device,
    pick_device,
    pick_dtype,
    pick_precision,
)
from desktop.engine.nanochat.classify import classify
from desktop.engine.nanochat.model import GPT

F32, BF16, F16 = torch.float32, torch.bfloat16, torch.float16
META = torch.device("meta")


def fake_machine(
    monkeypatch: pytest.MonkeyPatch,
    *,
    sm: tuple[int, int] | None = None,
    gpu_name: str = "NVIDIA Fake",
    mps: bool = False,
    macos14: bool = True,
    fbgemm: bool = False,
) -> None:
    """Make torch report this machine: a CUDA GPU of compute capability ``sm`` (None: no CUDA),
    MPS (on macOS 14+ or older), and whether its CPU build has fbgemm."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: sm is not None)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: sm)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: gpu_name)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: mps)
    monkeypatch.setattr(torch.backends.mps, "is_macos_or_newer", lambda major, minor: macos14)
    monkeypatch.setattr(gemv, "fbgemm_available", lambda: fbgemm)


# Each machine: how it is faked, the device "auto" picks, and what each precision gives there as
# (compute dtype, matrix-vector kind, name), or None where it is refused.
MACHINES = {
    "H100 (SM90)": (
        {"sm": (9, 0), "fbgemm": True},
        "cuda",
        {
            "auto": (BF16, "exact", "bfloat16"),
            "float32": (F32, "exact", "float32"),
            "bfloat16": (BF16, "exact", "bfloat16"),
            "float16": (F16, "exact", "float16"),  # not fbgemm's packed fp16: that is CPU-only
            "fast": (BF16, "exact", "bfloat16"),
            "int8": None,
        },
    ),
    "A100 (SM80)": (
        {"sm": (8, 0), "fbgemm": True},
        "cuda",
        {
            "auto": (BF16, "exact", "bfloat16"),
            "float32": (F32, "exact", "float32"),
            "bfloat16": (BF16, "exact", "bfloat16"),
            "float16": (F16, "exact", "float16"),
            "fast": (BF16, "exact", "bfloat16"),
            "int8": None,
        },
    ),
    # Pre-Ampere: nanochat's "auto" is fp32; bf16 has no tensor cores there, fp16 has.
    "T4 (SM75)": (
        {"sm": (7, 5), "fbgemm": True},
        "cuda",
        {
            "auto": (F32, "exact", "float32"),
            "float32": (F32, "exact", "float32"),
            "bfloat16": (BF16, "exact", "bfloat16"),  # asked for by name: torch emulates it
            "float16": (F16, "exact", "float16"),
            "fast": (F16, "exact", "float16"),
            "int8": None,
        },
    ),
    # nanochat leaves bf16 on MPS an opt-in: "auto" stays fp32, "fast" is bf16.
    "MPS, macOS 14": (
        {"mps": True, "macos14": True},
        "mps",
        {
            "auto": (F32, "exact", "float32"),
            "float32": (F32, "exact", "float32"),
            "bfloat16": (BF16, "exact", "bfloat16"),
            "float16": (F16, "exact", "float16"),
            "fast": (BF16, "exact", "bfloat16"),
            "int8": None,
        },
    ),
    "MPS, macOS 13": (
        {"mps": True, "macos14": False},
        "mps",
        {
            "auto": (F32, "exact", "float32"),
            "float32": (F32, "exact", "float32"),
            "bfloat16": None,  # Metal has no bf16 before macOS 14
            "float16": (F16, "exact", "float16"),
            "fast": (F16, "exact", "float16"),
            "int8": None,
        },
    ),
    "x86 CPU with fbgemm": (
        {"fbgemm": True},
        "cpu",
        {
            "auto": (F32, "exact", "float32"),
            "float32": (F32, "exact", "float32"),
            "bfloat16": (BF16, "exact", "bfloat16"),
            "float16": (F32, "fp16", "fp16 weights"),
            "fast": (F32, "fp16", "fp16 weights"),
            "int8": (F32, "int8", "int8 weights"),
        },
    ),
    # Apple M-series CPU, Graviton: no fbgemm, but fast and int8 are still 16- and 8-bit weights
    # with fp32 activations, by whichever of torch's kernels is timed fastest there.
    "arm64 CPU without fbgemm": (
        {"fbgemm": False},
        "cpu",
        {
            "auto": (F32, "exact", "float32"),
            "float32": (F32, "exact", "float32"),
            "bfloat16": (BF16, "exact", "bfloat16"),
            "float16": (F16, "exact", "float16"),
            "fast": (F32, "fp16", "fp16 weights"),
            "int8": (F32, "int8", "int8 weights"),
        },
    ),
}


@pytest.mark.parametrize("machine", MACHINES)
def test_each_precision_on_each_machine(monkeypatch, machine):
    faked, device_type, expected = MACHINES[machine]
    fake_machine(monkeypatch, **faked)
    device = pick_device("auto")
    assert device.type == device_type
    assert set(expected) == set(PRECISIONS)
    for preference, outcome in expected.items():
        if outcome is None:
            with pytest.raises(DeviceError) as err:
                pick_precision(device, preference)
            assert "\n" not in str(err.value)
            continue
        precision = pick_precision(device, preference)
        assert (precision.compute, precision.gemv, precision.name) == outcome, preference
        if preference not in ("fast", "int8"):
            # the dtype-only choice (HF and KempnerForge models) names the same dtype
            dtype = pick_dtype(device, preference)
            assert dtype == (precision.compute if preference == "auto" else getattr(torch, preference))


@pytest.mark.parametrize("where", ["cuda", "mps"])
def test_int8_off_the_cpu_is_refused_in_one_line_naming_the_reason(where):
    hw = Hardware(where, sm=(9, 0) if where == "cuda" else (0, 0), mps_bf16=True, fbgemm=False)
    with pytest.raises(DeviceError) as err:
        choose_precision(hw, "int8")
    message = str(err.value)
    assert "\n" not in message and "CPU" in message and "fast" in message
    assert where.upper() in message


def test_auto_device_prefers_cuda_then_mps_then_cpu(monkeypatch):
    fake_machine(monkeypatch, sm=(8, 6), mps=True)
    assert pick_device("auto").type == "cuda"
    fake_machine(monkeypatch, mps=True)
    assert pick_device("auto").type == "mps"
    fake_machine(monkeypatch)
    assert pick_device("auto").type == "cpu"


def test_an_explicit_device_the_machine_lacks_is_one_line(monkeypatch):
    fake_machine(monkeypatch)  # a CPU only
    refusals = {"cuda": "CUDA was requested", "mps": "MPS was requested", "tpu": "unknown device"}
    for preference, phrase in refusals.items():
        with pytest.raises(DeviceError) as err:
            pick_device(preference)
        assert phrase in str(err.value) and "\n" not in str(err.value)
    assert pick_device("cpu").type == "cpu"
    fake_machine(monkeypatch, sm=(9, 0), mps=True)
    assert {pick_device(p).type for p in DEVICES if p != "auto"} == {"cpu", "cuda", "mps"}


def test_unknown_precisions_are_refused_on_every_machine():
    for hw in (Hardware("cuda", sm=(9, 0)), Hardware("mps", mps_bf16=True), Hardware("cpu", fbgemm=True)):
        for bad in ("fp8", "BF16", "", "float64"):
            with pytest.raises(DeviceError, match="unknown precision"):
                choose_precision(hw, bad)


def test_describe_device_names_the_gpu_and_its_compute_capability(monkeypatch):
    fake_machine(monkeypatch, sm=(7, 5), gpu_name="Tesla T4")
    assert describe_device(torch.device("cuda")) == "CUDA: Tesla T4 (SM 7.5)"
    assert describe_device(torch.device("mps")) == "MPS (Apple GPU)"
    assert describe_device(torch.device("cpu")) == f"CPU · {torch.get_num_threads()} threads"


# ----- no CPU-only kernel, cache or constant off the CPU -----------------------------------------


def test_packs_never_holds_a_weight_off_the_cpu():
    big = (gemv.MIN_PACKED_SIDE, gemv.MIN_PACKED_SIDE)
    for kind in ("fp16", "int8"):
        assert gemv.packs(torch.empty(big), kind)  # the CPU weight is packed...
        assert not gemv.packs(torch.empty(big, device=META), kind)  # ...a device weight never


def test_exact_mode_splits_rows_only_for_cpu_fp32():
    """The row split hands blocks to CPU threads; on a GPU it would only add a launch."""
    rows = max(gemv.MIN_SPLIT_BYTES // (4 * 256), 64)
    assert gemv.ExactLinear(torch.zeros(rows, 256))._splittable
    assert not gemv.ExactLinear(torch.zeros(rows, 256, dtype=BF16))._splittable
    for dtype in (F32, BF16, F16):
        assert not gemv.ExactLinear(torch.empty(rows, 256, dtype=dtype, device=META))._splittable


def _config(era: str):
    tiny = default_config(era)
    shapes = {k: t.shape for k, t in make_state_dict(era, tiny).items()}
    return classify(make_meta(era, tiny), shapes, f"{era} (test)")


def _cpu_tensors(model: GPT) -> list[str]:
    """Names of tensors the prepared model holds on the CPU: parameters, buffers and the weights
    its kernels keep (a packed kernel keeps a ScriptObject, found by its type instead)."""
    found = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.device.type == "cpu"]
    for name, module in model.named_modules():
        kernel = module.__dict__.get("forward")
        if isinstance(kernel, (gemv.PackedFp16Linear, gemv.Int8Linear)):
            found.append(f"{name}: {type(kernel).__name__}")
        weight = getattr(kernel, "weight", None)
        if isinstance(weight, torch.Tensor) and weight.device.type == "cpu":
            found.append(f"{name}: kernel weight")
    return found


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item)


class DeviceMixWatch(TorchFunctionMode):
    """Records every torch call given tensors on two devices, as CUDA and MPS would refuse it (a
    0-dim CPU tensor passes there as a scalar). The meta device checks elementwise ops itself but
    lets ``F.linear``, ``mm`` and ``embedding`` mix devices, so a product fed a CPU row would
    otherwise go unseen."""

    def __init__(self) -> None:
        super().__init__()
        self.mixed: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        devices = {t.device.type for t in _tensors((args, kwargs)) if t.dim() or t.device.type != "cpu"}
        if len(devices) > 1:
            self.mixed.append(f"{getattr(func, '__name__', func)} on {sorted(devices)}")
        return func(*args, **kwargs)


@pytest.mark.parametrize("fused_agrees", [True, False], ids=["fused-qkv", "qkv-by-parts"])
@pytest.mark.parametrize("era", ERAS)
def test_every_era_runs_off_the_cpu_in_every_kind(monkeypatch, era, fused_agrees):
    """Prepared for a non-CPU device, in each matrix-vector kind (even the CPU-only ones asked
    for by mistake) and each 16-bit dtype, a model keeps everything on that device: prefill, a
    chunk appended to the cache (the masked SDPA path), decode steps past the cache's capacity
    (it grows) all run, and the constants ``prepare`` makes are Python floats, not CPU tensors.

    The meta device computes no values, so exact mode's bit check of the fused q|k|v product
    cannot run there: its verdict is faked both ways, which covers both routes."""
    monkeypatch.setattr(gemv, "_verdicts", {})  # verdicts are kept per process: start afresh
    monkeypatch.setattr(gemv.ExactLinear, "_matches", lambda self, route, align: fused_agrees)
    cfg = _config(era)
    for kind, dtype in (("exact", BF16), ("plain", F16), ("fp16", BF16), ("int8", F32)):
        with META:
            model = GPT(cfg)
        watch = DeviceMixWatch()
        with watch:
            model.to(dtype).prepare(META, dtype, kind)
            cache = KVCache(cfg, 1, 8, model.device, model.compute_dtype)
            model(torch.zeros(1, 5, dtype=torch.long, device=META), cache, last_only=True)
            model(torch.zeros(1, 3, dtype=torch.long, device=META), cache)
            for _ in range(2):
                logits = model(torch.zeros(1, 1, dtype=torch.long, device=META), cache)
        assert watch.mixed == [], f"{kind}: {watch.mixed[:3]}"
        assert _cpu_tensors(model) == []
        assert isinstance(model.softcap, float)
        assert all(isinstance(b.attn.qk_scale, float) for b in model.blocks)
        assert cache.pos == 10 and cache.capacity > 8
        assert logits.device == META and logits.dtype == F32 and logits.shape == (1, 1, cfg.vocab_size)
        held = [cache.k, cache.v, cache.tokens, model.rotation, *cache.engram.values()]
        assert all(t.device == META for t in held) and model.rotation.dtype == dtype
