"""SAM: one step on a quadratic against the formula by hand, and rho = 0 against the base optimiser."""

from __future__ import annotations

import pytest
import torch

from vision_tx.optim import SAM

# f(w) = 1/2 w^T A w - b^T w, gradient A w - b.
A = torch.tensor([[3.0, 0.5, 0.0], [0.5, 2.0, -0.3], [0.0, -0.3, 1.5]], dtype=torch.float64)
B = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)
W0 = torch.tensor([0.7, -1.1, 2.3], dtype=torch.float64)


def quadratic_closure(w: torch.nn.Parameter, optimizer: torch.optim.Optimizer):
    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = 0.5 * w @ A @ w - B @ w
        loss.backward()
        return loss

    return closure


@pytest.mark.parametrize("adaptive", [False, True])
def test_one_step_on_a_quadratic_is_the_formula(adaptive: bool) -> None:
    rho, lr, momentum = 0.3, 0.1, 0.9
    w = torch.nn.Parameter(W0.clone())
    optimizer = SAM([w], torch.optim.SGD, rho=rho, adaptive=adaptive, lr=lr, momentum=momentum)
    optimizer.step(quadratic_closure(w, optimizer))

    g = A @ W0 - B
    if adaptive:
        e = rho * W0.abs() ** 2 * g / torch.linalg.vector_norm(W0.abs() * g)
    else:
        e = rho * g / torch.linalg.vector_norm(g)
    g_sharp = A @ (W0 + e) - B
    # SGD's first step with momentum: the buffer is the gradient itself.
    torch.testing.assert_close(w.detach(), W0 - lr * g_sharp, rtol=0, atol=1e-14)
    assert not torch.allclose(g_sharp, g)  # the second gradient is taken away from w


def test_rho_zero_is_the_base_optimizer() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.GELU(), torch.nn.Linear(8, 3))
    twin = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.GELU(), torch.nn.Linear(8, 3))
    twin.load_state_dict(model.state_dict())
    sam = SAM(model.parameters(), torch.optim.AdamW, rho=0.0, lr=1e-2, weight_decay=0.05)
    adamw = torch.optim.AdamW(twin.parameters(), lr=1e-2, weight_decay=0.05)
    for _step in range(4):
        x, y = torch.randn(6, 5), torch.randint(0, 3, (6,))

        def closure(net=model, opt=sam):
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(net(x), y)
            loss.backward()
            return loss

        sam.step(closure)
        adamw.zero_grad()
        torch.nn.functional.cross_entropy(twin(x), y).backward()
        adamw.step()
    for p, q in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=0)
    assert sam.state_dict()["state"].keys() == adamw.state_dict()["state"].keys()


def test_wrapping_shares_groups_and_no_gradient_means_no_step() -> None:
    w = torch.nn.Parameter(W0.clone())
    base = torch.optim.SGD([w], lr=0.1)
    sam = SAM.wrapping(base, rho=0.1)
    assert sam.param_groups is base.param_groups
    sam.param_groups[0]["lr"] = 0.5  # a scheduler writing the base optimiser's groups
    assert base.param_groups[0]["lr"] == 0.5

    def skipped() -> torch.Tensor:  # what the non-finite loss guard leaves: no gradients
        w.grad = None
        return torch.tensor(float("nan"))

    sam.step(skipped)
    torch.testing.assert_close(w.detach(), W0)
    with pytest.raises(RuntimeError, match="closure"):
        sam.step()
