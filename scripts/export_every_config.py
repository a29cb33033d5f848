"""Exports the model of every config in ``vision_tx/configs`` at its full size to ONNX and runs it in onnxruntime
against the eager model: every config's model exports. The test suite does the same on toy-sized
models of every family (tests/test_export.py); this script is its full-size pass, too slow for CI (Swin-L, Swin-B,
ViT-B: minutes each on 2 CPU cores).

Each model is built from its config with the class count of the dataset the config names (ImageNet 1000, COCO
detection and instances 91, COCO panoptic 201 with ids 1-90 things, ADE20K 150; the toy configs their toy sets'
4), its weights moved off their initialisation (tests/parity.py ``perturb_``; class logits spread x20 except under
sigmoid detectors, as in the tests), wrapped with its post-processing (``vision_tx.export.deployable``), exported at
a dynamic batch and a fixed image size (the size the config's family is run at, below), and run in onnxruntime at
batches 1 and 2 of other random images, against the eager wrapper. First with the tests' comparisons
(tests/test_export.py: floating outputs within 1e-4, plus 1e-6 of the value here, as pixel boxes at 640 px are float32
to 6e-5; the others equal; detections up to near-tied scores): "exact". Random full-size models have more near-ties than
float rounding leaves alone (queries alike, two-stage top-k over thousands of proposals, pixels between two alike
masks), so a config passes when at least 99% of each output agrees: eager detections found in onnxruntime's (label,
score, box), panoptic pixels in the same segment (whatever its number), labels and pixels equal, floats within
tolerance. Below 99%, the network alone (its outputs before any post-processing) is exported and compared: within 1e-4,
the difference lies in near-ties the post-processing decides (perturbed DETR panoptic's 100 masks differ by about 1e-6
from query to query, less than float rounding), and the config passes, reported as such; otherwise it fails. The export
logic itself is held exactly by the tests on toy-sized models of every family.

    python scripts/export_every_config.py --out runs/export_every_config.json
    python scripts/export_every_config.py --only dino_swin_l upernet_swin_b_ade20k

Prints one line per config (parameters, export seconds, ONNX size, largest difference, or the failure) and writes
them all to ``--out``. Exit status 1 if any config fails.
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests/ holds the perturbation and the comparisons

import torch  # noqa: E402

from tests.test_export import IS_THING, TOLERANCE, assert_detections_close, assert_outputs_close, build_task, run_onnx  # noqa: E402
from vision_tx.config_loader import load_config  # noqa: E402
from vision_tx.export import Deployable, DetectionExport, PanopticExport, deployable, example_images, export  # noqa: E402
from vision_tx.lightning.cli import resolve_config  # noqa: E402

SIGMOID_DETECTORS = ("dino", "rtdetr", "dfine")  # detector names whose class logits stay as they are (see build_task)
COCO_PANOPTIC_IS_THING = {i: i <= 90 for i in range(1, 201)}
AGREEMENT = 0.99  # of detections, labels, pixels: random-weight models have near-ties that float rounding decides
DETECTION_OUTPUTS = ("boxes", "scores", "labels")
RTOL = 1e-6  # besides the tests' 1e-4: boxes in pixels of a 640-wide image are float32 to 6e-5 (16 of its steps)


def task_setting(config: str) -> tuple[int, dict[int, bool] | None, tuple[int, int]]:
    """(class count, panoptic is_thing or None, image size H, W) of ``config``'s task at full size."""
    section = load_config(resolve_config(config))["model"]
    task = section["class_path"].rsplit(".", 2)[-2]
    if "toy" in config:
        return 4, IS_THING if task == "panoptic" else None, (128, 128)
    if task == "classification":
        return 1000, None, (224, 224)
    if task == "segmentation":
        return 150, None, (512, 512)
    if task == "panoptic":
        return 201, COCO_PANOPTIC_IS_THING, (384, 512)
    return 91, None, (384, 512)  # COCO detection and instances


def detections_found(got: list[torch.Tensor], expected: tuple[torch.Tensor, ...]) -> float:
    """The fraction of eager detections (label set) that onnxruntime also gives, anywhere in its list: same label,
    score within 1e-4, box within 1e-4 plus ``RTOL`` of its coordinates."""
    (got_boxes, got_scores, got_labels), (boxes, scores, labels) = got, expected
    found = total = 0
    for b in range(len(labels)):
        for i in torch.nonzero(labels[b] >= 0).flatten().tolist():
            close = ((got_boxes[b] - boxes[b, i]).abs() <= TOLERANCE + RTOL * boxes[b, i].abs()).all(-1)
            found += bool(
                (close & (got_labels[b] == labels[b, i]) & ((got_scores[b] - scores[b, i]).abs() <= TOLERANCE)).any()
            )
            total += 1
    return found / max(total, 1)


def segments_found(got: list[torch.Tensor], expected: tuple[torch.Tensor, ...]) -> float:
    """The fraction of pixels whose panoptic segment onnxruntime also gives, whatever its number: each eager segment
    is paired with the onnxruntime segment of the same label that holds most of its pixels (a segment dropped or kept
    at a near-tie renumbers all the later ones)."""
    (got_ids, got_labels, _), (ids, labels, _) = got, expected
    found = 0
    for b in range(len(ids)):
        count = int(max(ids[b].max(), got_ids[b].max())) + 1
        pairs = torch.bincount((ids[b] * count + got_ids[b]).flatten(), minlength=count * count).view(count, count)
        label = torch.cat([torch.tensor([-1]), labels[b]])[:count]  # segment 0 (no segment): label -1
        got_label = torch.cat([torch.tensor([-1]), got_labels[b]])[:count]
        found += int((pairs * (label[:, None] == got_label[None, :])).amax(1).sum())
    return found / ids.numel()


def box_detections(model: torch.nn.Module) -> bool:
    """Whether ``model`` exports a detector's ``boxes``, ``scores`` and ``labels`` (not Mask2Former's masks)."""
    return isinstance(model, DetectionExport) and model.output_names == DETECTION_OUTPUTS


def outputs_agreement(model: torch.nn.Module, got: list[torch.Tensor], expected: tuple[torch.Tensor, ...]) -> float:
    """The smallest agreement over ``model``'s outputs: detections found (:func:`detections_found`), panoptic pixels
    in the same segment (:func:`segments_found`), and for every other output the fraction of its elements equal
    (integers: labels, masks, segment maps) or within 1e-4 plus ``RTOL``."""
    if isinstance(model, PanopticExport):
        return segments_found(got, expected)
    named = dict(zip(model.output_names, got))
    fractions = [detections_found([named[n] for n in DETECTION_OUTPUTS], expected)] if box_detections(model) else []
    for name, b in zip(model.output_names, expected):
        if fractions and name in DETECTION_OUTPUTS:
            continue
        a = named[name].to(b.dtype)
        close = (a - b).abs() <= TOLERANCE + RTOL * b.abs() if b.is_floating_point() else a == b
        fractions.append(close.float().mean().item() if close.numel() else 1.0)
    return min(fractions)


class NetworkOutputs(Deployable):
    """The network of an exportable model without its post-processing: its output tensors (a dict's, in key order).
    A two-stage detector (DINO, RT-DETR: ``enc_outputs``) gives its picked proposals' best class logits instead,
    sorted: the queries its decoder reads are the top-k of thousands of proposals, where near-tied scores can pick
    another, equally scored proposal; sorted, the scores agree all the same."""

    def __init__(self, network: torch.nn.Module, name: str, names: tuple[str, ...]) -> None:
        super().__init__(network, name)
        self.output_names = names

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, ...]:
        outputs = self.network(self.normalize(images))
        if not isinstance(outputs, dict):
            return (outputs,)
        if "enc_outputs" in outputs:
            return (outputs["enc_outputs"]["pred_logits"].max(-1).values.sort(-1, descending=True).values,)
        return tuple(outputs[name] for name in self.output_names)


def network_outputs_difference(model: Deployable, size: tuple[int, int], path: Path) -> tuple[float, tuple[str, ...]]:
    """The largest difference between onnxruntime and eager on ``model``'s network outputs (see
    :class:`NetworkOutputs`), exported at ``size``, on one image, beyond ``RTOL`` of their size; and the names of the
    outputs compared."""
    images = example_images(size, 1, seed=11)
    with torch.no_grad():
        outputs = model.network(model.normalize(images))
    if not isinstance(outputs, dict):
        names = ("output",)
    elif "enc_outputs" in outputs:
        names = ("proposal_scores_sorted",)
    else:
        names = tuple(k for k, v in outputs.items() if isinstance(v, torch.Tensor))
    network = NetworkOutputs(model.network, model.name, names).eval()
    info = export(network, path, "onnx", images, dynamic_size=False, dynamic_batch=False)
    with torch.no_grad():
        expected = network(images)
    difference = max(
        0.0, *(((a - b).abs() - RTOL * b.abs()).max().item() for a, b in zip(run_onnx(info["path"], images), expected))
    )
    return difference, names


def check_config(config: str, folder: Path) -> dict[str, Any]:
    """Exports ``config``'s full-size model to ``folder`` and compares onnxruntime with eager; the figures."""
    num_classes, is_thing, size = task_setting(config)
    detector = str(load_config(resolve_config(config))["model"]["init_args"].get("detector", ""))
    class_scale = 1.0 if detector.startswith(SIGMOID_DETECTORS) else 20.0
    module = build_task(config, class_scale=class_scale, num_classes=num_classes)
    model = deployable(module, config, is_thing)
    parameters = sum(p.numel() for p in module.parameters())
    start = time.perf_counter()
    info = export(model, folder / f"{config}.onnx", "onnx", example_images(size, 2), dynamic_size=False)
    export_seconds = time.perf_counter() - start
    strict, agreement, largest = True, 1.0, 0.0
    for batch in (1, 2):
        images = example_images(size, batch, seed=batch + 10)
        with torch.no_grad():
            ours = model(images)
        got = run_onnx(info["path"], images)
        try:  # the tests' comparisons first
            if box_detections(model):
                assert_detections_close(got, ours, RTOL)
            else:
                assert_outputs_close(got, ours, model.output_names, RTOL)
        except AssertionError:
            strict = False
        agreement = min(agreement, outputs_agreement(model, got, ours))
        largest = max(
            [largest, *((a - b).abs().max().item() for a, b in zip(got, ours) if b.is_floating_point() and b.numel())]
        )
    network_difference, network_compared = None, ()
    if (
        agreement < AGREEMENT
    ):  # near-ties, or a wrong export? The network's own outputs, before any post-processing, decide
        network_difference, network_compared = network_outputs_difference(
            model, size, folder / f"{config}_network.onnx"
        )
        if network_difference > TOLERANCE:
            raise AssertionError(
                f"onnxruntime agrees with eager on {agreement:.2%} of the outputs (at least {AGREEMENT:.0%} "
                f"needed), and the network's own outputs ({', '.join(network_compared)}) "
                f"differ by {network_difference:.1e}"
            )
    return {
        "config": config,
        "model": type(model).__name__,
        "classes": num_classes,
        "size": list(size),
        "parameters_m": round(parameters / 1e6, 1),
        "export_s": round(export_seconds, 1),
        "onnx_mb": round(info["path"].stat().st_size / 2**20, 1),
        "dims": info["dims"],
        "largest_difference": largest,
        "strict": strict,
        "agreement": agreement,
        "network_difference": network_difference,
        "network_compared": list(network_compared),
        "ok": True,
    }


def outcome(result: dict[str, Any]) -> str:
    """How a passing config's outputs compared: exactly, on 99% or more, or only before post-processing."""
    if result["strict"]:
        return "exact"
    if result["network_difference"] is None:
        return f"agrees on {result['agreement']:.2%}"
    return (
        f"network outputs ({', '.join(result['network_compared'])}) within {result['network_difference']:.0e}, "
        f"then near-ties (agrees on {result['agreement']:.2%})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="*", help="these configs (names or YAML files) only (default: every one)")
    parser.add_argument("--out", type=Path, help="a JSON file for the results")
    args = parser.parse_args()
    configs = args.only or sorted(path.stem for path in (ROOT / "vision_tx" / "configs").glob("*.yaml"))
    for config in configs:
        try:
            resolve_config(config)
        except SystemExit as err:
            parser.error(str(err))
    print(
        f"{len(configs)} configs; torch {torch.__version__}, {platform.processor() or platform.machine()}, "
        f"{torch.get_num_threads()} threads",
        flush=True,
    )
    results = []
    with tempfile.TemporaryDirectory() as folder:
        for config in configs:
            start = time.perf_counter()
            try:
                result = check_config(config, Path(folder))
            except Exception as err:  # one config's failure is reported, the others still run
                result = {"config": config, "ok": False, "error": "".join(traceback.format_exception_only(err)).strip()}
            result["total_s"] = round(time.perf_counter() - start, 1)
            results.append(result)
            if result["ok"]:
                print(
                    f"ok   {config:36s} {result['model']:26s} {result['parameters_m']:6.1f} M  "
                    f"{result['size'][0]}x{result['size'][1]}  "
                    f"export {result['export_s']:6.1f} s  {result['onnx_mb']:6.1f} MB  "
                    f"{outcome(result)}, largest difference "
                    f"{result['largest_difference']:.1e}  ({result['total_s']:.0f} s)",
                    flush=True,
                )
            else:
                print(
                    f"FAIL {config:36s} {' | '.join(line for line in result['error'].splitlines() if line.strip())}",
                    flush=True,
                )
            for path in Path(folder).glob("*.onnx"):
                path.unlink()
            gc.collect()
    failed = [r["config"] for r in results if not r["ok"]]
    print(
        f"{len(results) - len(failed)} of {len(results)} configs export and match eager"
        + (f"; failed: {', '.join(failed)}" if failed else "")
    )
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"torch": torch.__version__, "results": results}, indent=1))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
