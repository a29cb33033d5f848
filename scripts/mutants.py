"""Plants single-line bugs one at a time in a temporary copy of the checkout and runs the tests meant to catch them.

Each mutant is one plausible bug of the kinds a parity claim must rule out: a swapped, skipped or
dropped norm, a bias not loaded, an activation added or removed, a bias table transposed or flipped,
a threshold moved. A mutant that no test kills ("SURVIVED") means a claim the suite does not back.
Not part of the test suite: run it after adding a parity claim, and add a mutant for it (see
docs/TESTING.md).

    python scripts/mutants.py                 # every mutant
    python scripts/mutants.py --only swin     # mutants whose name contains "swin"
    python scripts/mutants.py --list
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SWIN_TIMM = "tests/backbones/test_swin.py::test_timm_weights_give_timm_logits[swin_t]"
NAT = "tests/backbones/test_nat_official.py"  # the independent NAT reference (tests/backbones/nat_reference.py)
NA2D = "tests/ops/test_na2d.py"
RESNET = "tests/models/test_detr.py::test_resnet_reads_torchvision_weights"
DETR = "tests/models/test_detr.py::test_outputs_and_loss_match_transformers"
DETR_PANOPTIC = "tests/models/test_detr_panoptic.py"
MASK_HEAD = "tests/heads/test_detr_mask_head.py"
UPERNET = "tests/heads/test_upernet.py"
PQ = "tests/metrics/test_panoptic_rules.py"
COCO = "tests/metrics/test_coco_rules.py"


@dataclass(frozen=True)
class Mutant:
    name: str
    path: str  # relative to the checkout
    before: str  # must occur exactly once in the file
    after: str
    tests: tuple[str, ...]  # pytest node ids: only these run


MUTANTS = [
    # Swin
    Mutant("swin: norm1 and norm2 swapped", "vision_tx/backbones/swin.py",
           "self._window_attention(self.norm1(t), attn_mask)", "self._window_attention(self.norm2(t), attn_mask)", (SWIN_TIMM,)),
    Mutant("swin: bias table transposed (query/key)", "vision_tx/backbones/swin.py",
           "return bias.permute(2, 0, 1).contiguous()", "return bias.permute(2, 1, 0).contiguous()", (SWIN_TIMM,)),
    Mutant("swin: patch-merging norm dropped", "vision_tx/backbones/swin.py",
           "return self.reduction(self.norm(x))", "return self.reduction(x)", (SWIN_TIMM,)),
    Mutant("swin: MLP GELU removed", "vision_tx/backbones/layers.py",
           'self.fc1 = Linear(dim, hidden, activation="gelu")', "self.fc1 = Linear(dim, hidden)", (SWIN_TIMM,)),
    Mutant("swin: bf16 attention without its 1/sqrt(d) scale", "vision_tx/backbones/swin.py",
           "scores = torch.matmul(q * q.shape[-1] ** -0.5, k.transpose(-2, -1))", "scores = torch.matmul(q, k.transpose(-2, -1))",
           ("tests/backbones/test_swin.py::test_bf16_autocast_stays_close_to_fp32",)),
    Mutant("swin: attention proj bias not loaded", "vision_tx/backbones/swin.py",
           'if key.endswith(("relative_position_index", "attn_mask")):',
           'if key.endswith(("relative_position_index", "attn_mask", "attn.proj.bias")):', (SWIN_TIMM,)),
    # NAT
    Mutant("nat: GELU added in the stem", "vision_tx/backbones/nat.py",
           "return self.norm(self.proj(images).permute(0, 2, 3, 1))",
           "return self.norm(self.proj[1](F.gelu(self.proj[0](images))).permute(0, 2, 3, 1))", (NAT,)),
    Mutant("nat: norm1 and norm2 swapped", "vision_tx/backbones/nat.py",
           "self._residual(self.attn(self.norm1(t)), self.gamma1)", "self._residual(self.attn(self.norm2(t)), self.gamma1)", (NAT,)),
    Mutant("nat: downsampler norm dropped", "vision_tx/backbones/nat.py",
           "return self.norm(self.reduction(x.permute(0, 3, 1, 2)).permute(0, 2, 3, 1))",
           "return self.reduction(x.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)", (NAT,)),
    Mutant("na2d: bias table flipped", "vision_tx/ops/neighborhood_attention.py",
           "bias = rpb[:, rows.bias_index][..., cols.bias_index]", "bias = rpb.flip(-1)[:, rows.bias_index][..., cols.bias_index]", (NA2D,)),
    # ResNet (DETR's backbone)
    Mutant("resnet: ReLU after bn1 removed", "vision_tx/backbones/resnet.py",
           "out = F.relu(_conv_norm(block.conv1, block.bn1, x), inplace=True)", "out = _conv_norm(block.conv1, block.bn1, x)", (RESNET,)),
    Mutant("resnet: frozen BN mean not subtracted", "vision_tx/backbones/resnet.py",
           "shift = norm.bias - norm.running_mean * scale", "shift = norm.bias", (RESNET,)),
    # DETR
    Mutant("detr: decoder norm2 and norm3 swapped", "vision_tx/heads/detr/transformer.py",
           "tgt = self.norm2(tgt + self.dropout(attended))", "tgt = self.norm3(tgt + self.dropout(attended))", (DETR,)),
    Mutant("detr: encoder FFN ReLU removed", "vision_tx/heads/detr/transformer.py",
           "return self.norm2(src + self.dropout(self.linear2(self.dropout(F.relu(self.linear1(src))))))",
           "return self.norm2(src + self.dropout(self.linear2(self.dropout(self.linear1(src)))))", (DETR,)),
    Mutant("detr: decoder output norm dropped", "vision_tx/heads/detr/transformer.py",
           "return self.norm(torch.stack(outputs))", "return torch.stack(outputs)", (DETR,)),
    Mutant("detr converter: cross-attention read into self-attention", "vision_tx/models/detr.py",
           'converted[key.replace(".multihead_attn.", ".cross_attn.")] = value',
           'converted[key.replace(".multihead_attn.", ".self_attn.")] = value', (DETR,)),
    Mutant("detr converter: packed q/k/v rows read in k/v/q order", "vision_tx/models/detr.py",
           'converted[key.replace(".multihead_attn.", ".cross_attn.")] = value',
           'converted[key.replace(".multihead_attn.", ".cross_attn.")] = value.roll(-value.shape[0] // 3, 0) if "in_proj" in key else value',
           (DETR, DETR_PANOPTIC)),
    Mutant("detr mask head: ReLU after GroupNorm removed", "vision_tx/heads/detr/mask_head.py",
           "nn.GroupNorm(GROUPS, out_channels), nn.ReLU())", "nn.GroupNorm(GROUPS, out_channels))", (MASK_HEAD,)),
    # UperNet
    Mutant("upernet: ConvBNReLU ReLU removed", "vision_tx/heads/fcn.py",
           "act=nn.ReLU(inplace=True),", "act=nn.Identity(),", (UPERNET,)),
    Mutant("upernet: top-down pathway not added", "vision_tx/heads/upernet.py",
           "laterals[i - 1] = laterals[i - 1] + self._resize(laterals[i], laterals[i - 1].shape[-2:])",
           "laterals[i - 1] = laterals[i - 1]", (UPERNET,)),
    # Panoptic quality
    Mutant("pq: void/crowd threshold 0.5 -> 0.9", "vision_tx/metrics/panoptic.py",
           "if ignored / pred_area[j] <= 0.5:", "if ignored / pred_area[j] <= 0.9:", (PQ,)),
    Mutant("pq: match IoU > 0.5 -> >= 0.5", "vision_tx/metrics/panoptic.py", "if iou > 0.5:", "if iou >= 0.5:", (PQ,)),
    Mutant("pq: crowd regions of every category", "vision_tx/metrics/panoptic.py",
           'for i in crowd_of_category.get(pred["category_id"], ()))',
           "for i in sum(crowd_of_category.values(), []))", (PQ,)),
    Mutant("pq: void pixels kept in the union", "vision_tx/metrics/panoptic.py",
           "iou = inter / (pred_area[j] + gt_area[i] - inter - on_void[j])",
           "iou = inter / (pred_area[j] + gt_area[i] - inter)", (PQ,)),
    # COCO evaluation (pycocotools behind vision_tx's conversion of the predictions)
    Mutant("coco: boxes handed over as xyxy", "vision_tx/metrics/coco.py",
           'result["bbox"] = [x1, y1, x2 - x1, y2 - y1]', 'result["bbox"] = [x1, y1, x2, y2]', (COCO,)),
    Mutant("coco: evaluated over every image, not those seen", "vision_tx/metrics/coco.py",
           "evaluator.params.imgIds = sorted(int(i) for i in image_ids)", "pass", ("tests/metrics/test_coco_eval.py",)),
]


def copy_checkout(destination: Path) -> None:
    """Tracked and untracked, not ignored, files of the checkout into ``destination``."""
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout.split("\0")
    for name in filter(None, files):
        source = ROOT / name
        if source.is_file():
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, destination / name)


def run_tests(checkout: Path, tests: tuple[str, ...], timeout: float) -> tuple[bool, str]:
    """Whether the tests pass in ``checkout``, and pytest's last line."""
    env = dict(os.environ, PYTHONPATH=str(checkout), CI="true", OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    # the copy sits elsewhere, so point it at this checkout's ../shared/data
    env.setdefault("VISION_TX_SHARED_DATA", str(ROOT.parent / "shared" / "data"))
    command = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *tests]
    try:
        result = subprocess.run(command, cwd=checkout, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return False, f"timed out after {timeout:.0f}s"
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    return result.returncode == 0, lines[-1] if lines else result.stderr.strip()[-200:]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="", help="run the mutants whose name contains this text")
    parser.add_argument("--list", action="store_true", help="list the mutants and their tests, run nothing")
    parser.add_argument("--baseline", action="store_true", help="first check that the unmutated tests pass")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per mutant")
    args = parser.parse_args()
    mutants = [m for m in MUTANTS if args.only in m.name]
    if args.list:
        for mutant in mutants:
            print(f"{mutant.name:50s} {mutant.path}  ->  {' '.join(mutant.tests)}")
        return 0
    with tempfile.TemporaryDirectory(prefix="vision_tx_mutants_") as tmp:
        checkout = Path(tmp)
        copy_checkout(checkout)
        if args.baseline:
            tests = tuple(dict.fromkeys(t for m in mutants for t in m.tests))
            passed, summary = run_tests(checkout, tests, args.timeout * len(tests))
            print(f"baseline: {'pass' if passed else 'FAIL'} ({summary})", flush=True)
            if not passed:
                return 2
        survivors = []
        print(f"{'mutant':50s} {'result':8s} {'seconds':>7s}  tests", flush=True)
        for mutant in mutants:
            path = checkout / mutant.path
            original = path.read_text()
            if original.count(mutant.before) != 1:
                print(f"{mutant.name:50s} {'STALE':8s} {'':>7s}  the line is not in {mutant.path} exactly once: update the mutant")
                survivors.append(mutant.name)
                continue
            path.write_text(original.replace(mutant.before, mutant.after))
            start = time.perf_counter()
            try:
                passed, summary = run_tests(checkout, mutant.tests, args.timeout)
            finally:
                path.write_text(original)
            result = "SURVIVED" if passed else "killed"
            if passed:
                survivors.append(mutant.name)
            print(f"{mutant.name:50s} {result:8s} {time.perf_counter() - start:7.0f}  {summary}", flush=True)
    print(f"\n{len(mutants) - len(survivors)} of {len(mutants)} killed" + (f"; survived or stale: {survivors}" if survivors else ""))
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main())
