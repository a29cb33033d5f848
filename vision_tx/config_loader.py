"""Config files with shared bases: a config names, in one top-level key, the files it builds on.

    # vision_tx/configs/dino_swin_s.yaml
    __base__: [_base/coco_detection.yaml, _base/dino_12e.yaml]
    model:
      init_args:
        backbone: swin_s

The rules (docs: README, "Configs"):

- ``__base__`` is a list of entries (or one entry). An entry ending in ``.yaml`` or ``.yml`` is a file, relative to the
  folder of the file that names it (or absolute); any other entry is a config name, found as ``--config NAME`` finds
  one (``./configs/NAME.yaml``, then the package's ``vision_tx/configs/NAME.yaml``; ``_base/coco_detection`` is the
  package's base from a config of your own).
- The bases are merged in their order, each over the ones before, and the file's own keys over them all. A base may
  have bases of its own.
- Merging is deep for mappings (a key the later file leaves out keeps the earlier value); anything else, a list
  included, is replaced whole: a config that sets ``trainer.callbacks`` lists every callback it runs.
- A base that does not exist is an error naming the file that names it; a file reached again through its own bases
  is an error showing the circle.

The command line (:class:`vision_tx.lightning.cli.VisionTxArgumentParser`) reads every ``--config`` file through
:func:`load_config`, so ``--print_config`` prints the merged config with every default. The merged file alone:

    python -m vision_tx.config_loader dino_swin_s                # as YAML, bases merged
    python -m vision_tx.config_loader --all > tests/fixtures/resolved_configs.json   # every shipped config
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

PACKAGE_CONFIGS = Path(__file__).resolve().parent / "configs"
# A folder of the user's own configs first, then those shipped inside the package (package data).
CONFIG_DIRS = (Path.cwd() / "configs", PACKAGE_CONFIGS)
BASE_KEY = "__base__"


class ConfigError(ValueError):
    """A config whose bases cannot be read: a missing base, a circle of bases, a malformed ``__base__``."""


def find_config(name: str) -> Path | None:
    """The file of the config called ``name`` (``detr_swin_t``, ``_base/coco_detection``) in :data:`CONFIG_DIRS`.

    Args:
        name: a config name, without ``.yaml``.

    Returns:
        The first ``DIR/name.yaml`` that exists, or None.
    """
    return next((d / f"{name}.yaml" for d in CONFIG_DIRS if (d / f"{name}.yaml").is_file()), None)


def merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """``override`` over ``base``: mappings merged key by key, any other value (a list too) replaced whole.

    Args:
        base: the earlier config.
        override: the later one.

    Returns:
        A new dict; neither argument is changed.
    """
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def load_config(path: str | Path) -> dict[str, Any]:
    """The dict the config at ``path`` means: its YAML content (comments dropped), its bases merged under it.

    Args:
        path: a config file.

    Raises:
        ConfigError: a base is missing, bases form a circle, or ``__base__`` is not a list of names or files.
    """
    return _load(Path(path).resolve(), ())


def resolve_bases(content: dict[str, Any], path: str | Path | None = None) -> dict[str, Any]:
    """``content`` (a config already read) with its ``__base__`` merged under it, the bases found from ``path``'s
    folder (without ``path``: the working directory's).

    Args:
        content: a config's top-level mapping.
        path: the file it was read from, if any.

    Raises:
        ConfigError: as :func:`load_config`.
    """
    file = Path(path).resolve() if path is not None else None
    return _with_bases(content, file, (file,) if file else ())


def _load(file: Path, chain: tuple[Path, ...]) -> dict[str, Any]:
    if file in chain:
        circle = " -> ".join(str(p) for p in (*chain[chain.index(file) :], file))
        raise ConfigError(f"config bases form a circle: {circle}")
    try:
        content = yaml.safe_load(file.read_text())
    except yaml.YAMLError as err:
        raise ConfigError(f"{file}: not valid YAML: {err}") from err
    if content is None:
        content = {}
    if not isinstance(content, dict):
        raise ConfigError(f"{file}: a config is a mapping of sections, not {type(content).__name__}")
    return _with_bases(content, file, (*chain, file))


def _with_bases(content: dict[str, Any], file: Path | None, chain: tuple[Path, ...]) -> dict[str, Any]:
    if BASE_KEY not in content:
        return content
    where = str(file) if file else "the --config string"
    entries = content[BASE_KEY]
    entries = [entries] if isinstance(entries, str) else entries
    if not isinstance(entries, list) or not all(isinstance(entry, str) and entry for entry in entries):
        raise ConfigError(f"{where}: {BASE_KEY} is a list of config names or YAML files, not {content[BASE_KEY]!r}")
    merged: dict[str, Any] = {}
    for entry in entries:
        merged = merge(merged, _load(_base_file(entry, file, where), chain))
    return merge(merged, {key: value for key, value in content.items() if key != BASE_KEY})


def _base_file(entry: str, file: Path | None, where: str) -> Path:
    """The file a ``__base__`` entry of ``file`` names (see the module's rules)."""
    if entry.endswith((".yaml", ".yml")):
        candidate = Path(entry) if Path(entry).is_absolute() else (file.parent if file else Path.cwd()) / entry
        if not candidate.is_file():
            raise ConfigError(f"{where}: its base {entry!r} does not exist ({candidate.resolve()})")
        return candidate.resolve()
    found = find_config(entry)
    if found is None:
        folders = " or ".join(str(d) for d in CONFIG_DIRS)
        raise ConfigError(
            f"{where}: its base {entry!r} is no config name (no {entry}.yaml in {folders}); "
            "a file is named with its .yaml suffix, relative to this file's folder"
        )
    return found.resolve()


def resolved_configs(folder: str | Path = PACKAGE_CONFIGS) -> dict[str, dict[str, Any]]:
    """Every config of ``folder`` (its ``*.yaml`` files, not the bases under ``_base/``) as :func:`load_config`
    reads it, by name.

    Args:
        folder: a folder of configs (default: the package's).
    """
    return {path.stem: load_config(path) for path in sorted(Path(folder).glob("*.yaml"))}


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m vision_tx.config_loader NAME|FILE``: the config with its bases merged, as YAML;
    ``--all``: every shipped config as one JSON object, by name (the test fixture).

    Args:
        ``argv``: the command-line arguments (default: the process's).
    """
    parser = argparse.ArgumentParser(prog="python -m vision_tx.config_loader", description=main.__doc__)
    parser.add_argument("config", nargs="?", help="a config name (as --config takes) or a YAML file")
    parser.add_argument("--all", action="store_true", help="every config of vision_tx/configs/ as one JSON object")
    args = parser.parse_args(argv)
    if args.all == bool(args.config):
        parser.error("give a config or --all")
    if args.all:
        json.dump(resolved_configs(), sys.stdout, indent=1, sort_keys=True)
        sys.stdout.write("\n")
        return
    path = Path(args.config) if Path(args.config).is_file() else find_config(args.config)
    if path is None:
        parser.error(f"no config named {args.config!r}")
    try:
        sys.stdout.write(yaml.safe_dump(load_config(path), sort_keys=False))
    except ConfigError as err:
        parser.error(str(err))


if __name__ == "__main__":
    main()
