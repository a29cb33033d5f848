"""Planted bugs in the operators: deformable attention, the fused feed-forward block, the oneDNN training path (see ``tests/mutants/__init__.py``)."""

from tests.mutants.mutant import Mutant
from tests.mutants.targets import DINO_TX, DINO_TX_GRAD, FFN, LINEAR_TRAINING, MSDA, ONEDNN

MUTANTS = [
    # Multi-scale deformable attention (the operator, against transformers' grid_sample version)
    Mutant(
        "ms_deform_attn: half-pixel offset dropped (align_corners=True)",
        "vision_tx/ops/ms_deform_attn.py",
        "pixel = (locations.to(compute_dtype) * 2 - 1 + 1) * (sizes / 2) - 0.5",
        "pixel = (locations.to(compute_dtype) * 2 - 1 + 1) * (sizes / 2)",
        (MSDA,),
    ),
    Mutant(
        "ms_deform_attn: x and y of the level size swapped",
        "vision_tx/ops/ms_deform_attn.py",
        "sizes = torch.stack([width, height], -1).to(compute_dtype)",
        "sizes = torch.stack([height, width], -1).to(compute_dtype)",
        (MSDA,),
    ),
    Mutant(
        "ms_deform_attn: bilinear weights read x for y",
        "vision_tx/ops/ms_deform_attn.py",
        "upper, lower = weight * (1 - fy), weight * fy",
        "upper, lower = weight * (1 - fx), weight * fx",
        (MSDA,),
    ),
    Mutant(
        "ms_deform_attn: bordered row width off by one",
        "vision_tx/ops/ms_deform_attn.py",
        "bordered_width = width + 2",
        "bordered_width = width + 1",
        (MSDA,),
    ),
    Mutant(
        "ms_deform_attn: top-right and bottom-left neighbours swapped",
        "vision_tx/ops/ms_deform_attn.py",
        "[torch.zeros_like(bordered_width), torch.ones_like(bordered_width), bordered_width, bordered_width + 1], -1",
        "[torch.zeros_like(bordered_width), bordered_width, torch.ones_like(bordered_width), bordered_width + 1], -1",
        (MSDA,),
    ),
    Mutant(
        "ms_deform_attn: level start offsets of the next levels",
        "vision_tx/ops/ms_deform_attn.py",
        "[(h + 2) * (w + 2) for h, w in shapes[:-1]]",
        "[(h + 2) * (w + 2) for h, w in shapes[1:]]",
        (MSDA,),
    ),
    Mutant(
        "ms_deform_attn: samples just outside the border read nothing",
        "vision_tx/ops/ms_deform_attn.py",
        "touches = ((corner >= -1) & (corner < sizes)).all(-1)",
        "touches = ((corner >= 0) & (corner < sizes)).all(-1)",
        (MSDA,),
    ),
    Mutant(
        "ms_deform_attn backward: weight gradient rows swapped",
        "vision_tx/ops/ms_deform_attn.py",
        "grad_weight = torch.lerp(top, bottom, fy).to(weight.dtype)",
        "grad_weight = torch.lerp(bottom, top, fy).to(weight.dtype)",
        (MSDA,),
    ),
    Mutant(
        "ms_deform_attn backward: wrong sign of the y location gradient",
        "vision_tx/ops/ms_deform_attn.py",
        "grad_frac = torch.stack([grad_fx, weight * (bottom - top)], -1)",
        "grad_frac = torch.stack([grad_fx, weight * (top - bottom)], -1)",
        (MSDA,),
    ),
    Mutant(
        "ms_deform_attn backward: value gradient with the wrong corner's weights",
        "vision_tx/ops/ms_deform_attn.py",
        'grad_rows, grad_output, counts.cumsum(0) - counts, mode="sum", per_sample_weights=sorted_weights[corner]',
        'grad_rows, grad_output, counts.cumsum(0) - counts, mode="sum", per_sample_weights=sorted_weights[3 - corner]',
        (MSDA,),
    ),
    # The fused residual feed-forward block (against autograd through the plain layers)
    Mutant(
        "feed forward: ReLU gradient passes where the output is zero",
        "vision_tx/ops/feed_forward.py",
        "grad_hidden, hidden, 0.0, grad_input=grad_hidden)",
        "grad_hidden, hidden, -1.0, grad_input=grad_hidden)",
        (FFN, DINO_TX_GRAD),
    ),
    Mutant(
        "feed forward: oneDNN's first product without ReLU",
        "vision_tx/ops/feed_forward.py",
        'hidden = _ONEDNN_LINEAR(rows, weight1, bias1, "relu", [], "")',
        'hidden = _ONEDNN_LINEAR(rows, weight1, bias1, "none", [], "")',
        (FFN,),
    ),
    Mutant(
        "feed forward: second bias dropped",
        "vision_tx/ops/feed_forward.py",
        "output = (rows + bias2).addmm_(hidden, weight2.t())",
        "output = rows.clone().addmm_(hidden, weight2.t())",
        (FFN, DINO_TX),
    ),
    Mutant(
        "feed forward (oneDNN, float32): residual not added to the output",
        "vision_tx/ops/feed_forward.py",
        'output = _ONEDNN_LINEAR(hidden, weight2, bias2, "none", [], "").add_(rows)',
        'output = _ONEDNN_LINEAR(hidden, weight2, bias2, "none", [], "")',
        (FFN,),
    ),
    Mutant(
        "feed forward (oneDNN, float32): residual gradient dropped",
        "vision_tx/ops/feed_forward.py",
        "grad_x = product(grad_hidden, weight1).add_(grad) if ctx.onednn",
        "grad_x = product(grad_hidden, weight1) if ctx.onednn",
        (FFN,),
    ),
    # The oneDNN training path of the linear layers (against float64 autograd)
    Mutant(
        "linear training: GELU skipped in the forward",
        "vision_tx/ops/linear_autograd.py",
        "            out = F.gelu(out)",
        "            out = out",
        (LINEAR_TRAINING,),
    ),
    Mutant(
        "linear training: bias gradient taken before GELU's gradient",
        "vision_tx/ops/linear_autograd.py",
        "grad_bias = grad.sum(0) if ctx.needs_input_grad[2]",
        "grad_bias = grad_output.flatten(0, -2).sum(0) if ctx.needs_input_grad[2]",
        (LINEAR_TRAINING,),
    ),
    Mutant(
        "linear training: GELU's gradient at the output, not the pre-activation",
        "vision_tx/ops/linear_autograd.py",
        "grad = torch.ops.aten.gelu_backward(grad, pre)",
        "grad = torch.ops.aten.gelu_backward(grad, F.gelu(pre))",
        (LINEAR_TRAINING,),
    ),
    Mutant(
        "linear training: the weight gradient's rows from the input's first rows only",
        "vision_tx/ops/linear_autograd.py",
        "        return onednn_product(grad.t(), rows)",
        "        return onednn_product(grad[:1].t(), rows[:1])",
        (LINEAR_TRAINING,),
    ),
    Mutant(
        "linear training: broadcast (stride-0) gradients handed to oneDNN as they are",
        "vision_tx/ops/linear_autograd.py",
        "a, b = (t.contiguous() if 0 in t.stride() else t for t in (a, b))",
        "pass",
        (LINEAR_TRAINING,),
    ),
    # Where the training products run (oneDNN, or torch's operators on Intel CPUs with MKL)
    Mutant(
        "oneDNN training: the switch ignored",
        "vision_tx/ops/linear_autograd.py",
        "        onednn_training_enabled()\n        and onednn_linear_may_run(x)",
        "        onednn_linear_may_run(x)",
        (LINEAR_TRAINING,),
    ),
    Mutant(
        "oneDNN training: MKL said to keep up on any vendor",
        "vision_tx/ops/onednn.py",
        'return mkl and "GenuineIntel" in cpuinfo',
        "return mkl",
        (ONEDNN,),
    ),
    Mutant(
        "oneDNN training: the CPU's default inverted",
        "vision_tx/ops/onednn.py",
        "    return not mkl_products_keep_up()",
        "    return mkl_products_keep_up()",
        (ONEDNN,),
    ),
]
