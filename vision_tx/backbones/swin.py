"""Swin Transformer (Liu et al., 2021, https://arxiv.org/abs/2103.14030): attention in shifted windows.

Every block attends within non-overlapping ``M x M`` windows with a learned relative position bias
(a table of ``(2M-1)^2`` entries per head); every second block first rolls the map by ``M // 2`` so
that windows straddle the previous block's borders, and a mask keeps tokens that the roll brought
together from different image regions apart. Stages are joined by patch merging (2x2 neighbours
concatenated, normalised and projected to twice the channels).

Native layout: ``stem`` (patch embedding), ``stages.{i}`` with the patch merging that *enters*
stage ``i`` (``stages.{i}.downsample``, ``i > 0``), its ``blocks`` and its output norm
(``stages.{i}.out_norm``); the classifier adds ``head``. :meth:`SwinTransformer.convert_state_dict`
maps timm's and Microsoft's layouts onto it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from vision_tx.backbones.base import norms_and_biases
from vision_tx.backbones.layers import (
    ClassifierMixin,
    Mlp,
    PatchEmbed,
    Stage,
    StagedBackbone,
    add_chunked,
    drop_path,
    init_weights,
)
from vision_tx.backbones.registry import register_backbone, register_classifier
from vision_tx.ops import Linear
from vision_tx.ops.size_tables import cached_size_table

# embed_dim, depths, num_heads and window_size from the paper (Table 1); drop_path_rate is the
# stochastic depth of the paper's ImageNet recipe for each size. swin_toy is Swin-T's block design at a
# quarter of its width, two blocks a stage, no stochastic depth: a CPU trains it in minutes (the toy configs).
VARIANTS: dict[str, dict] = {
    "swin_t": dict(embed_dim=96, depths=(2, 2, 6, 2), num_heads=(3, 6, 12, 24), window_size=7, drop_path_rate=0.2),
    "swin_s": dict(embed_dim=96, depths=(2, 2, 18, 2), num_heads=(3, 6, 12, 24), window_size=7, drop_path_rate=0.3),
    "swin_b": dict(embed_dim=128, depths=(2, 2, 18, 2), num_heads=(4, 8, 16, 32), window_size=7, drop_path_rate=0.5),
    "swin_l": dict(embed_dim=192, depths=(2, 2, 18, 2), num_heads=(6, 12, 24, 48), window_size=12, drop_path_rate=0.2),
    "swin_toy": dict(embed_dim=32, depths=(2, 2, 2, 2), num_heads=(1, 2, 4, 8), window_size=7, drop_path_rate=0.0),
}

# Official Swin adds -100 (not -inf) between tokens of different regions; kept for identical outputs.
_MASKED = -100.0


# The index tables below are cached per size and device; built outside inference mode, so that a
# model first run under ``torch.inference_mode`` can still be trained.
@cached_size_table(maxsize=32)
@torch.inference_mode(False)
def relative_position_index(window: tuple[int, int], table_window: int, device: torch.device) -> torch.Tensor:
    """``[N, N]`` rows of the ``(2M-1)^2`` bias table (``table_window`` is ``M``) for each query/key pair of a
    ``window`` (``N = h*w``), on ``device``.

    ``window`` may be smaller than the table's ``M`` (maps smaller than a window); it then reads the
    central part of the table.
    """
    ys, xs = torch.meshgrid(
        torch.arange(window[0], device=device), torch.arange(window[1], device=device), indexing="ij"
    )
    ys, xs = ys.flatten(), xs.flatten()
    dy = ys[:, None] - ys[None, :] + table_window - 1
    dx = xs[:, None] - xs[None, :] + table_window - 1
    return dy * (2 * table_window - 1) + dx


@cached_size_table(maxsize=32)
@torch.inference_mode(False)
def shift_mask(
    padded: tuple[int, int], window: tuple[int, int], shift: tuple[int, int], device: torch.device
) -> torch.Tensor:
    """``[nW, N, N]`` additive mask (0 or -100) of the rolled map: tokens attend only within their region.

    For a map of ``padded`` (h, w) size (multiples of ``window``), rolled by ``-shift``, on ``device``: the last
    ``shift`` rows/columns hold the wrapped-around first ones; regions are the bands ``[0, H-M)``, ``[H-M, H-s)``,
    ``[H-s, H)`` along each rolled axis.
    """

    def bands(size: int, win: int, s: int) -> torch.Tensor:
        band = torch.zeros(size, dtype=torch.long, device=device)
        if s:
            band[size - win :] = 1
            band[size - s :] = 2
        return band

    region = bands(padded[0], window[0], shift[0])[:, None] * 3 + bands(padded[1], window[1], shift[1])[None, :]
    windows = window_partition(region[None, :, :, None], window).flatten(0, 1).squeeze(-1)  # [nW, N]
    different = windows[:, :, None] != windows[:, None, :]
    return torch.zeros(different.shape, device=device).masked_fill_(different, _MASKED)


def window_partition(x: torch.Tensor, window: tuple[int, int]) -> torch.Tensor:
    """``x [B, H, W, C] -> [B, nW, h*w, C]`` windows of ``window`` (h, w) in row-major order (H, W multiples of the
    window)."""
    batch, height, width, channels = x.shape
    x = x.view(batch, height // window[0], window[0], width // window[1], window[1], channels)
    return x.transpose(2, 3).reshape(batch, -1, window[0] * window[1], channels)


def padded_size(size: tuple[int, int], window: tuple[int, int]) -> tuple[int, int]:
    """``size`` rounded up to multiples of ``window``: the map the windows tile."""
    return -(-size[0] // window[0]) * window[0], -(-size[1] // window[1]) * window[1]


@cached_size_table(maxsize=64)
@torch.inference_mode(False)
def window_gather(
    size: tuple[int, int], window: tuple[int, int], shift: tuple[int, int], device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token indices that roll, partition and un-partition a map in one gather each, on ``device``.

    For a map of ``size`` zero-padded to ``padded`` (multiples of ``window``) and rolled by ``-shift`` (``shift``:
    rows, columns): ``partition [Hp*Wp]`` is, for each token of the windows (row-major windows, row-major inside),
    its index in the flattened padded map; ``restore [H*W]`` is, for each token of the unpadded map,
    its position among the windows (undoing the roll and dropping the padding).
    """
    padded = padded_size(size, window)
    rows = (torch.arange(padded[0], device=device) + shift[0]) % padded[0]
    cols = (torch.arange(padded[1], device=device) + shift[1]) % padded[1]
    source = rows[:, None] * padded[1] + cols[None, :]
    partition = window_partition(source[None, :, :, None], window).flatten()
    position = torch.empty_like(partition)
    position[partition] = torch.arange(partition.numel(), device=device)
    restore = position.view(padded)[: size[0], : size[1]].flatten()
    return partition, restore


def gather_rows(x: torch.Tensor, index: torch.Tensor, rows_per_sample: int) -> torch.Tensor:
    """``x [B, R, C]`` (any shape with those sizes, ``rows_per_sample`` is ``R``) -> ``[B * len(index), C]``: each
    sample's rows ``index [K]``. Gathering rows of a 2-d tensor is the fastest form of ``index_select``."""
    batch = x.numel() // (rows_per_sample * x.shape[-1])
    if batch > 1:
        index = (torch.arange(batch, device=index.device)[:, None] * rows_per_sample + index).flatten()
    return x.reshape(-1, x.shape[-1]).index_select(0, index)


class PatchMerging(nn.Module):
    """2x2 neighbours concatenated, LayerNorm, linear to ``2C``: ``[N,H,W,C] -> [N, ceil(H/2), ceil(W/2), 2C]``.

    Odd sizes are zero-padded at the bottom/right. The concatenation order (top-left, bottom-left,
    top-right, bottom-right) is the official one, which the ``reduction`` weights depend on.
    """

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(4 * dim)
        self.reduction = Linear(4 * dim, 2 * dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, height, width, channels = x.shape
        x = F.pad(x, (0, 0, 0, width % 2, 0, height % 2))
        x = x.view(batch, (height + 1) // 2, 2, (width + 1) // 2, 2, channels)
        x = x.permute(0, 1, 3, 4, 2, 5).flatten(3)  # [.., col offset, row offset, C]
        return self.reduction(self.norm(x))


class WindowAttention(nn.Module):
    """Multi-head self-attention inside windows with a relative position bias table ``[(2M-1)^2, heads]``."""

    def __init__(self, dim: int, num_heads: int, window_size: int, qkv_bias: bool) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.window_size = window_size
        self.qkv = Linear(dim, 3 * dim, bias=qkv_bias)
        self.proj = Linear(dim, dim)
        self.relative_position_bias_table = nn.Parameter(torch.zeros((2 * window_size - 1) ** 2, num_heads))
        nn.init.trunc_normal_(self.relative_position_bias_table, std=0.02)

    def relative_position_bias(self, window: tuple[int, int]) -> torch.Tensor:
        """``[heads, N, N]`` bias for a ``window`` of ``N = h*w`` tokens."""
        index = relative_position_index(window, self.window_size, self.relative_position_bias_table.device)
        tokens = index.shape[0]
        bias = self.relative_position_bias_table.index_select(0, index.flatten()).view(tokens, tokens, -1)
        return bias.permute(2, 0, 1).contiguous()

    def forward(self, windows: torch.Tensor, attn_mask: torch.Tensor) -> torch.Tensor:
        """``windows [B, nW, N, C]`` and an additive ``attn_mask``, ``[heads, N, N]`` or per window
        ``[nW, heads, N, N]`` -> ``[B, nW, N, C]``."""
        batch, num_windows, tokens, channels = windows.shape
        qkv = self.qkv(windows).view(batch * num_windows, tokens, 3, self.num_heads, channels // self.num_heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each [B*nW, heads, N, d], views of qkv
        # The fused kernels take 4-d inputs and masks, which may be strided but broadcast only along
        # axes of size one: a per-window mask is repeated for each image (half the size of q, k, v).
        if attn_mask.dim() == 3:
            attn_mask = attn_mask.unsqueeze(0)
        elif batch > 1:
            attn_mask = attn_mask.repeat(batch, 1, 1, 1)
        # Exported (torch.export, then ONNX), the fused kernel's output strides would not survive the decomposition.
        if (q.device.type == "cpu" and q.dtype == torch.bfloat16) or torch.compiler.is_exporting():
            x = explicit_attention(q, k, v, attn_mask)
        else:
            x = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask.to(q.dtype))  # [B*nW, heads, N, d]
        return self.proj(x.transpose(1, 2).reshape(batch, num_windows, tokens, channels))


def explicit_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """``softmax(q k^T / sqrt(d) + bias) v`` with the scores in fp32: ``q [..., N, d]``, ``k [..., N, d]``,
    ``v [..., N, d]``, ``bias [..., N, N]`` -> ``[..., N, d]``.

    In bf16 on the CPU this is 20-40% faster than torch's fused kernel for windows of 49 tokens (measured:
    Swin-T's stage shapes, batch 8); in fp32 the fused kernel is faster.
    """
    scores = torch.matmul(q * q.shape[-1] ** -0.5, k.transpose(-2, -1)).float() + bias.float()
    return torch.matmul(scores.softmax(-1).to(v.dtype), v)


class SwinBlock(nn.Module):
    """Pre-norm (shifted-)window attention and MLP, each a residual branch with stochastic depth.

    Per axis, a map no larger than the window is one window of its own size and is not shifted (as in
    the official classifier, e.g. the 7x7 last stage at 224x224); larger maps are zero-padded at the
    bottom/right to a multiple of the window before the roll (as in the official detection backbone).
    """

    # Why ``vision_tx.export`` refuses a dynamic image size in ONNX for a model holding this block.
    onnx_fixed_size_reason = (
        "no dynamic image size in ONNX for Swin: its window tables take a remainder by the padded map size "
        "(aten.remainder.Scalar of a symbol, no ONNX translation) and, that rewritten, its window partition's "
        "Reshape fails in onnxruntime"
    )

    def __init__(
        self,
        dim: int,
        num_heads: int,
        window_size: int,
        shifted: bool,
        mlp_ratio: float,
        qkv_bias: bool,
        drop_path_rate: float,
    ) -> None:
        super().__init__()
        self.window_size = window_size
        self.shift_size = window_size // 2 if shifted else 0
        self.drop_path_rate = drop_path_rate
        self.norm1 = nn.LayerNorm(dim)
        self.attn = WindowAttention(dim, num_heads, window_size, qkv_bias)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = Mlp(dim, int(dim * mlp_ratio))

    def _windows(self, height: int, width: int) -> tuple[tuple[int, int], tuple[int, int]]:
        """The window and the roll for a ``height x width`` map."""
        window = (min(self.window_size, height), min(self.window_size, width))
        shift = tuple(self.shift_size if size > self.window_size else 0 for size in (height, width))
        return window, shift

    def attention_mask(self, height: int, width: int, device: torch.device) -> torch.Tensor:
        """Relative position bias, plus the region mask when rolled: ``[heads, N, N]`` or ``[nW, heads, N, N]``."""
        window, shift = self._windows(height, width)
        mask = self.attn.relative_position_bias(window)
        if any(shift):
            mask = mask + shift_mask(padded_size((height, width), window), window, shift, device).unsqueeze(1)
        return mask

    def _window_attention(self, x: torch.Tensor, attn_mask: torch.Tensor) -> torch.Tensor:
        """``[B, H, W, C] -> [B, H, W, C]``: pad, roll, partition, attend, and back."""
        batch, height, width, channels = x.shape
        window, shift = self._windows(height, width)
        padded = padded_size((height, width), window)
        if padded != (height, width):
            x = F.pad(x, (0, 0, 0, padded[1] - width, 0, padded[0] - height))
        partition, restore = window_gather((height, width), window, shift, x.device)
        windows = gather_rows(x, partition, partition.numel()).view(batch, -1, window[0] * window[1], channels)
        return gather_rows(self.attn(windows, attn_mask), restore, partition.numel()).view(
            batch, height, width, channels
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, H, W, C] -> [B, H, W, C]``."""
        attn_mask = self.attention_mask(x.shape[1], x.shape[2], x.device)
        x = add_chunked(
            x,
            lambda t: drop_path(self._window_attention(self.norm1(t), attn_mask), self.drop_path_rate, self.training),
            self.training,
            per_sample=True,
        )
        return add_chunked(
            x, lambda t: drop_path(self.mlp(self.norm2(t)), self.drop_path_rate, self.training), self.training
        )


class SwinStage(Stage):
    """Patch merging (all but the first stage), then ``depth`` blocks alternating plain and shifted windows."""

    def __init__(
        self,
        in_dim: int,
        dim: int,
        depth: int,
        num_heads: int,
        window_size: int,
        mlp_ratio: float,
        qkv_bias: bool,
        drop_path_rates: Sequence[float],
        downsample: bool,
        output: bool,
    ) -> None:
        super().__init__(
            PatchMerging(in_dim) if downsample else None,
            [
                SwinBlock(dim, num_heads, window_size, index % 2 == 1, mlp_ratio, qkv_bias, drop_path_rates[index])
                for index in range(depth)
            ],
            nn.LayerNorm(dim) if output else None,
        )


@register_backbone(VARIANTS)
class SwinTransformer(StagedBackbone):
    """Swin dense-prediction backbone: ``images [N,3,H,W] -> {"res2": [N,C,H/4,W/4], ..., "res5": [N,8C,H/32,W/32]}``.

    Any input size works: the image is padded to the patch size, each map to the window size, and
    odd maps before merging, so output sizes are ``ceil`` divisions. Only stages up to the last of
    ``out_indices`` are built; each returned stage has its own LayerNorm.
    """

    def __init__(
        self,
        embed_dim: int,
        depths: Sequence[int],
        num_heads: Sequence[int],
        window_size: int,
        drop_path_rate: float,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        patch_size: int = 4,
        in_chans: int = 3,
        out_indices: Sequence[int] = (0, 1, 2, 3),
        frozen_stages: int = -1,
        grad_checkpointing: bool = False,
    ) -> None:
        super().__init__()
        if window_size < 1:
            raise ValueError(f"{__name__}: window_size must be positive, got {window_size}")
        num_built = self.stages_to_build(__name__, depths, num_heads, out_indices)
        self.num_stages = len(depths)
        dims = [embed_dim * 2**i for i in range(self.num_stages)]
        rates = torch.linspace(0, drop_path_rate, sum(depths), device="cpu").tolist()
        self.stem = PatchEmbed(patch_size, in_chans, embed_dim)
        self.stages = nn.ModuleList(
            SwinStage(
                dims[max(i - 1, 0)],
                dims[i],
                depths[i],
                num_heads[i],
                window_size,
                mlp_ratio,
                qkv_bias,
                rates[sum(depths[:i]) : sum(depths[: i + 1])],
                downsample=i > 0,
                output=i in out_indices,
            )
            for i in range(num_built)
        )
        self._init_outputs(dims, [patch_size * 2**i for i in range(len(depths))], out_indices, frozen_stages)
        self.set_grad_checkpointing(grad_checkpointing)
        self.apply(init_weights)

    def no_weight_decay(self) -> set[str]:
        """Norms, biases and every block's relative position bias table."""
        tables = {
            f"{name}.relative_position_bias_table"
            for name, module in self.named_modules()
            if isinstance(module, WindowAttention)
        }
        return norms_and_biases(self) | tables

    def convert_state_dict(self, state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Maps timm, official Microsoft and native Swin state dicts onto this model's keys.

        Microsoft's ``layers.{i}.downsample`` ends stage ``i`` and becomes ``stages.{i+1}.downsample``
        here (timm's already starts stage ``i``); the final ``norm`` becomes the last stage's
        ``out_norm``; the detection backbone's per-output ``norm{i}`` (Swin-Transformer-Object-Detection
        and -Semantic-Segmentation checkpoints, under ``backbone.``, whose other modules are dropped)
        become ``stages.{i}.out_norm``; the ``relative_position_index`` and ``attn_mask`` buffers are
        dropped. Bias tables of another window size are resized bicubically on their ``(2M-1) x (2M-1)`` grid.
        """
        if any(key.startswith("backbone.") for key in state_dict):  # mmdetection / mmsegmentation
            state_dict = {
                key[len("backbone.") :]: value for key, value in state_dict.items() if key.startswith("backbone.")
            }
        microsoft = any(re.match(r"layers\.0\.downsample\.", key) for key in state_dict)
        expected = self.state_dict()
        converted: dict[str, torch.Tensor] = {}
        for key, value in state_dict.items():
            if key.endswith(("relative_position_index", "attn_mask")):
                continue
            key = _native_key(key, microsoft, final_stage=self.num_stages - 1)
            if key.endswith("relative_position_bias_table") and key in expected:
                value = resize_bias_table(value, expected[key].shape)
            converted[key] = value
        return converted


def _native_key(key: str, microsoft: bool, final_stage: int) -> str:
    key = re.sub(r"^patch_embed\.", "stem.", key)
    key = re.sub(r"^head\.fc\.", "head.", key)
    key = re.sub(r"^norm\.", f"stages.{final_stage}.out_norm.", key)
    key = re.sub(r"^norm(\d+)\.", r"stages.\1.out_norm.", key)
    match = re.match(r"^layers\.(\d+)\.downsample\.", key)
    if match:
        stage = int(match.group(1)) + (1 if microsoft else 0)
        return f"stages.{stage}.downsample." + key[match.end() :]
    return re.sub(r"^layers\.", "stages.", key)


def resize_bias_table(table: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """Bicubic resize of a ``table [(2M-1)^2, heads]`` to ``shape`` (another ``M``); other mismatches pass unchanged."""
    if table.shape == shape or table.ndim != 2 or table.shape[1] != shape[1]:
        return table
    source, target = round(table.shape[0] ** 0.5), round(shape[0] ** 0.5)
    if source**2 != table.shape[0] or target**2 != shape[0]:
        return table
    grid = table.float().T.reshape(1, -1, source, source)
    grid = F.interpolate(grid, size=(target, target), mode="bicubic", align_corners=False)
    return grid.reshape(-1, target * target).T.contiguous().to(table.dtype)


@register_classifier(VARIANTS)
class SwinClassifier(ClassifierMixin, SwinTransformer):
    """The ImageNet form: ``images [N,3,H,W] -> logits [N,num_classes]`` (last stage, its norm, average pool,
    ``head``)."""
