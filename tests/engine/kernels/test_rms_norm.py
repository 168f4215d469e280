"""The decode step's RMSNorm gives ``torch.rms_norm``'s bits (nanochat's ``F.rms_norm``), checked
on this machine's torch before it is used, and torch's own op wherever it cannot be."""

from __future__ import annotations

import logging

import pytest
import torch

from desktop.engine.kernels import rms_norm as rms


@pytest.fixture
def fresh_widths(monkeypatch):
    """No width checked yet, as in a new process."""
    widths: dict = {}
    monkeypatch.setattr(rms, "_widths", widths)
    return widths


def _rows(*shape: int, scale: float = 1.0, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale


@pytest.mark.parametrize(
    "shape",
    [(1, 1, 128), (1, 1, 768), (1, 5, 1280), (1, 1, 8, 32), (1, 3, 6, 128), (2, 7, 96)],
    ids=lambda s: "x".join(map(str, s)),
)
@pytest.mark.parametrize("scale", [1e-6, 1.0, 3e4])
def test_every_decode_shape_gets_torch_bits(fresh_widths, shape, scale):
    """Model rows, q|k heads, passes of a few rows and a batch, tiny to large values."""
    x = _rows(*shape, scale=scale, seed=len(shape))
    with torch.inference_mode():
        got = rms.rms_norm(x)
        assert fresh_widths[shape[-1]] is not None  # the ops were checked, and they are what ran
        assert torch.equal(got, torch.rms_norm(x, (shape[-1],)))


def test_a_row_sliced_out_of_a_wider_tensor(fresh_widths):
    """Non-contiguous rows (a slice of q|k|v) norm to the same bits as a copy of them."""
    wide = _rows(1, 4, 384)
    part = wide[..., :128]
    with torch.inference_mode():
        assert torch.equal(rms.rms_norm(part), torch.rms_norm(part.contiguous(), (128,)))


def test_zero_and_non_finite_rows_as_torch(fresh_widths):
    x = torch.stack([torch.zeros(64), torch.full((64,), float("inf")), torch.full((64,), float("nan"))])
    with torch.inference_mode():
        assert torch.equal(rms.rms_norm(x)[0], torch.rms_norm(x, (64,))[0])
        assert torch.rms_norm(x, (64,))[1:].isnan().all() and rms.rms_norm(x)[1:].isnan().all()


def test_training_keeps_torch_op_and_its_gradient(fresh_widths):
    """The demo trainer norms with autograd on: torch's op, whose backward it trains with."""
    x = _rows(2, 3, 64).requires_grad_()
    rms.rms_norm(x).sum().backward()
    expected = x.detach().clone().requires_grad_()
    torch.rms_norm(expected, (64,)).sum().backward()
    assert torch.equal(x.grad, expected.grad)
    assert 64 not in fresh_widths  # nothing checked: the ops never ran


def test_a_torch_whose_norm_rounds_otherwise_keeps_its_own(fresh_widths, monkeypatch, caplog):
    """Were torch's CPU rms_norm a fused kernel summing in another order, its bits are nanochat's:
    the check sees the difference, and that width keeps torch's op."""
    real = torch.rms_norm

    def fused_elsewhere(x, shape, *args, **kwargs):  # another rounding of the same function
        out = real(x, shape, *args, **kwargs)
        return torch.nextafter(out, torch.full_like(out, float("inf")))

    monkeypatch.setattr(torch, "rms_norm", fused_elsewhere)
    x = _rows(1, 1, 160)
    with caplog.at_level(logging.INFO, logger=rms.__name__), torch.inference_mode():
        got = rms.rms_norm(x)
        assert fresh_widths[160] is None
        assert torch.equal(got, fused_elsewhere(x, (160,)))
    assert "differ" in caplog.text
