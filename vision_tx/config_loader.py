"""The configs of ``vision_tx/configs/`` read as the command line reads them.

    python -m vision_tx.config_loader --all > tests/fixtures/resolved_configs.json

writes every shipped config as the dict it means (its YAML content; comments dropped), by name.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Sequence

import yaml

PACKAGE_CONFIGS = Path(__file__).resolve().parent / "configs"


def load_config(path: str | Path) -> dict[str, Any]:
    """The dict the YAML config at ``path`` means.

    Args:
        path: a config file.
    """
    content = yaml.safe_load(Path(path).read_text())
    return content if content is not None else {}


def resolved_configs(folder: str | Path = PACKAGE_CONFIGS) -> dict[str, dict[str, Any]]:
    """Every config of ``folder`` (its ``*.yaml`` files) as :func:`load_config` reads it, by name.

    Args:
        folder: a folder of configs (default: the package's).
    """
    return {path.stem: load_config(path) for path in sorted(Path(folder).glob("*.yaml"))}


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m vision_tx.config_loader --all``: every shipped config as JSON, by name (the test fixture).

    Args:
        argv: the command-line arguments (default: the process's).
    """
    parser = argparse.ArgumentParser(prog="python -m vision_tx.config_loader", description=main.__doc__)
    parser.add_argument("--all", action="store_true", help="every config of vision_tx/configs/ as one JSON object")
    args = parser.parse_args(argv)
    if not args.all:
        parser.error("give --all")
    json.dump(resolved_configs(), sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
