"""Shared backbone layers: chunked residual branches in CPU inference."""

from __future__ import annotations

import pytest
import torch

from vision_tx.backbones.layers import INFERENCE_CHUNK_TOKENS, add_chunked


def _recording(branch):
    shapes = []

    def run(x: torch.Tensor) -> torch.Tensor:
        shapes.append(tuple(x.shape))
        return branch(x)

    return run, shapes


def _per_sample(x: torch.Tensor) -> torch.Tensor:
    """A branch that mixes all tokens of a sample (as attention does), so a chunk split inside a sample shows."""
    return torch.tanh(x) * x.mean(dim=(1, 2), keepdim=True)


def _per_token(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.gelu(x) * 3.0


@pytest.mark.parametrize("per_sample, branch", [(True, _per_sample), (False, _per_token)])
def test_chunked_inference_equals_one_piece(per_sample: bool, branch) -> None:
    x = torch.randn(5, 40, 30, 8)  # 1200 tokens a sample: several chunks either way
    expected = x + branch(x)
    run, shapes = _recording(branch)
    with torch.inference_mode():
        actual = add_chunked(x, run, training=False, per_sample=per_sample)
    torch.testing.assert_close(actual, expected, rtol=0, atol=0)
    assert len(shapes) > 1
    if per_sample:
        assert all(len(shape) == 4 and shape[1:] == (40, 30, 8) for shape in shapes)
        assert sum(shape[0] for shape in shapes) == 5
    else:
        assert all(shape[0] <= INFERENCE_CHUNK_TOKENS for shape in shapes)
        assert sum(shape[0] for shape in shapes) == 5 * 40 * 30


@pytest.mark.parametrize("training, grad", [(True, False), (False, True), (True, True)])
def test_one_piece_when_training_or_differentiating(training: bool, grad: bool) -> None:
    x = torch.randn(5, 40, 30, 8, requires_grad=grad)
    run, shapes = _recording(_per_sample)
    with torch.set_grad_enabled(grad):
        out = add_chunked(x, run, training=training, per_sample=True)
    assert shapes == [(5, 40, 30, 8)]
    if grad:
        out.sum().backward()
        assert x.grad is not None


def test_one_piece_under_cpu_autocast() -> None:
    x = torch.randn(5, 40, 30, 8)
    run, shapes = _recording(_per_token)
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
        add_chunked(x, run, training=False)
    assert shapes == [(5, 40, 30, 8)]
