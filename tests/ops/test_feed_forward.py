"""``vision_tx.ops.feed_forward``: the hand-written backward against autograd through F.linear and F.relu."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
import torch.nn.functional as F

from tests.conftest import unavailable
from tests.parity import perturb_
from vision_tx.heads.dino.transformer import FeedForward
from vision_tx.ops.feed_forward import residual_feed_forward
from vision_tx.ops.onednn import onednn_training_enabled, set_onednn_training


def plain_layers(x, weight1, bias1, weight2, bias2):
    return x + F.linear(F.relu(F.linear(x, weight1, bias1)), weight2, bias2)


@pytest.fixture(params=[True, False], ids=["onednn-training", "plain-training"])
def onednn_training(request: pytest.FixtureRequest) -> Iterator[bool]:
    """The second product and the backward's on oneDNN, then on torch's operators (the default on Intel CPUs)."""
    default = onednn_training_enabled()
    set_onednn_training(request.param)
    if request.param and not onednn_training_enabled():
        unavailable("this torch build has no oneDNN linear kernel (torch.ops.mkldnn._linear_pointwise)")
    yield request.param
    set_onednn_training(default)


# float64 runs the portable path, float32 on the CPU oneDNN's fused kernel (a different summation order).
@pytest.mark.parametrize("dtype, tolerance", [(torch.float64, 1e-12), (torch.float32, 1e-5)])
def test_output_and_gradients_equal_autograd_through_the_plain_layers(
    dtype: torch.dtype, tolerance: float, onednn_training: bool
) -> None:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(2, 5, 6, dtype=dtype, generator=generator)
    weight1, bias1 = (
        torch.randn(9, 6, dtype=dtype, generator=generator),
        torch.randn(9, dtype=dtype, generator=generator),
    )
    weight2, bias2 = (
        torch.randn(6, 9, dtype=dtype, generator=generator),
        torch.randn(6, dtype=dtype, generator=generator),
    )
    if dtype == torch.float64:
        # A pre-activation exactly 0 (ReLU's gradient there is 0) whatever the BLAS's order of summation:
        # quarter-integer inputs and weights make every product and partial sum exact in float64.
        x[0, 0], weight1[0] = (x[0, 0] * 4).round() / 4, (weight1[0] * 4).round() / 4
        bias1[0] = -(x[0, 0] @ weight1[0])
        assert (F.linear(x, weight1, bias1)[0, 0, 0] == 0).item()
    grad = torch.randn(2, 5, 6, dtype=dtype, generator=generator)
    results = []
    for function in (residual_feed_forward, plain_layers):
        inputs = [t.clone().requires_grad_() for t in (x, weight1, bias1, weight2, bias2)]
        output = function(*inputs)
        output.backward(grad)
        results.append([output.detach(), *(t.grad for t in inputs)])
    for ours, expected in zip(*results):
        torch.testing.assert_close(ours, expected, rtol=tolerance, atol=tolerance)


def test_runs_under_cpu_bf16_autocast_as_the_plain_layers_do() -> None:
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(3, 6, generator=generator, requires_grad=True)
    weight1, bias1, weight2, bias2 = (
        torch.randn(*shape, generator=generator) for shape in ((9, 6), (9,), (6, 9), (6,))
    )
    with torch.autocast("cpu", dtype=torch.bfloat16):
        output = residual_feed_forward(x, weight1, bias1, weight2, bias2)
        expected = plain_layers(x, weight1, bias1, weight2, bias2)
    torch.testing.assert_close(output, expected, rtol=0, atol=0)
    output.sum().backward()
    assert x.grad is not None


@pytest.mark.parametrize("training", [True, False])
def test_dino_block_is_the_post_norm_ffn_with_and_without_dropout(training: bool) -> None:
    """DINO's ``FeedForward`` in training with dropout (the plain layers) and without (the fused function):
    LayerNorm(x + dropout(W2 dropout(relu(W1 x + b1)) + b2)), the same dropout draws on both sides."""
    block = perturb_(FeedForward(6, 9, dropout=0.3)).train(training)
    x = torch.randn(2, 5, 6, generator=torch.Generator().manual_seed(1))
    torch.manual_seed(0)
    output = block(x)
    torch.manual_seed(0)
    hidden = F.dropout(F.relu(x @ block.linear1.weight.T + block.linear1.bias), 0.3, training)
    branch = F.dropout(hidden @ block.linear2.weight.T + block.linear2.bias, 0.3, training)
    expected = F.layer_norm(x + branch, (6,), block.norm.weight, block.norm.bias)
    torch.testing.assert_close(output, expected, rtol=1e-5, atol=1e-5)
