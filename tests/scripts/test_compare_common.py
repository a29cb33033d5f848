"""scripts/compare_common.py's options: those after ``--`` go to vision_tx's training command."""

from __future__ import annotations

import runpy
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def test_options_after_the_double_dash_go_to_vision_tx() -> None:
    common = runpy.run_path(str(SCRIPTS / "compare_common.py"))
    parser = common["comparison_parser"]("doc", "a set", "dino_swin_toy", "runs/x")
    args, extra = common["parse_with_vision_tx_options"](parser, ["/data", "--seed", "1", "--", "--model.lr", "2e-4"])
    assert (args.root, args.seed, args.config, extra) == (Path("/data"), 1, "dino_swin_toy", ["--model.lr", "2e-4"])
    args, extra = common["parse_with_vision_tx_options"](parser, ["/data"])
    assert (args.seed, args.budget_seconds, extra) == (0, None, [])
