"""The kernels compiled on this machine (kernels/native.py): their products agree with fp32
``F.linear`` within their mode's bound for every row count a decode step, a verifying pass and a
prompt have; they use torch's threads whatever their count; and without a compiler the modes keep
torch's kernels, with the reason in the log."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from desktop.engine.kernels import gemv
from desktop.engine.kernels.native import MAX_ROWS, native_ops, why_no_compiler
from desktop.engine.kernels.threads import torch_threads
from desktop.engine.kernels.tuning import TOLERANCE, KernelTuner

pytestmark = pytest.mark.skipif(why_no_compiler() is not None, reason=f"{why_no_compiler()}")


@pytest.fixture(scope="module")
def ops():
    found = native_ops(None)
    assert found is not None, "a compiler is on the PATH, so the kernels must build"
    return found


def relative(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.double() - want.double()).norm() / want.double().norm()).item()


# Columns that are, and are not, a multiple of the kernel's 32 lanes (a tail is summed apart).
@pytest.mark.parametrize("shape", [(96, 64), (200, 100), (64, 3072)])
@pytest.mark.parametrize("rows", [1, 2, 5, MAX_ROWS, MAX_ROWS + 1, 40])
def test_products_are_within_their_modes_bound(ops, shape, rows):
    g = torch.Generator().manual_seed(rows)
    weight = torch.randn(*shape, generator=g)
    x = torch.randn(1, rows, shape[1], generator=g)
    want = F.linear(x, weight)
    with torch.inference_mode():
        int8 = gemv.NativeInt8Linear(weight, ops)(x)
        half = gemv.NativeHalfLinear(weight, ops)(x)
    assert int8.shape == half.shape == want.shape
    assert relative(int8, want) <= TOLERANCE["int8"]
    assert relative(half, want) <= TOLERANCE["fp16"]
    # Each row is computed alone: a pass of several rows gives each row what a pass of one gives.
    with torch.inference_mode():
        alone = torch.cat([gemv.NativeInt8Linear(weight, ops)(x[:, i : i + 1]) for i in range(rows)], 1)
    assert relative(alone, int8) < 1e-6


def test_more_threads_than_cores_compute_the_same(ops):
    g = torch.Generator().manual_seed(3)
    weight, x = torch.randn(1000, 256, generator=g), torch.randn(1, 3, 256, generator=g)
    kernel = gemv.NativeHalfLinear(weight, ops)
    with torch.inference_mode():
        with torch_threads(1):
            one = kernel(x)
        with torch_threads(4 * (torch.get_num_threads() or 1)):
            many = kernel(x)
    assert torch.equal(one, many)  # each output is one thread's sum, however the rows are shared


def test_the_tuner_times_them_with_the_others(ops, tmp_path):
    tuner = KernelTuner(tmp_path / "kernels.json")
    weight = torch.randn(512, 256)
    for kind, name in (("int8", "native int8"), ("fp16", "native fp16")):
        tuner.product(weight, kind)
        (choice,) = tuner.describe([tuner.product(weight, kind)])
        assert name in choice.timings_us, choice.line()


def test_without_a_compiler_the_modes_keep_torchs_kernels(tmp_path):
    """A fresh process whose compiler is missing: int8 mode still loads and computes, with
    torch's kernels, and the log says why there are no native ones."""
    code = (
        "import logging, sys, torch\n"
        "logging.basicConfig(level=logging.INFO, stream=sys.stdout)\n"
        "from desktop.engine.kernels.tuning import KernelTuner\n"
        "tuner = KernelTuner(None)\n"
        "w = torch.randn(256, 128)\n"
        "k = tuner.product(w, 'int8')\n"
        "print('CHOICE', tuner.describe([k])[0].line())\n"
        "print('OUT', tuple(k(torch.randn(1, 1, 128)).shape))\n"
    )
    env = {"CXX": "no-such-compiler-here", "NANOSCOPE_NATIVE_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "no native matrix kernels: no C++ compiler (no-such-compiler-here) on the PATH" in done.stdout
    choice = next(line for line in done.stdout.splitlines() if line.startswith("CHOICE"))
    assert "native" not in choice
    assert "OUT (1, 1, 256)" in done.stdout
    assert not list(tmp_path.iterdir())  # nothing was built
