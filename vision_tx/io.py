"""Result files and cross-process merging that data, metrics and the Lightning modules share (no Lightning here)."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import torch.distributed as dist


def gather_by_image_id(records: dict[int, Any]) -> dict[int, Any]:
    """Every process's ``records`` ``{image_id: record}`` merged, on every rank (a collective call under DDP).

    The first record of an id wins: the distributed sampler repeats samples to even out the shards.
    """
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return records
    shards: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(shards, records)
    merged: dict[int, Any] = {}
    for shard in shards:
        for image_id, record in shard.items():
            merged.setdefault(image_id, record)
    return merged


def write_json_atomic(data: Any, path: str | os.PathLike) -> Path:
    """Writes ``data`` as indented JSON to a temporary file beside ``path``, then renames it into place."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=2)
    os.replace(tmp, path)
    return path


def merge_metrics_json(section: str, values: dict[str, Any], path: str | os.PathLike) -> Path:
    """Adds or replaces ``{section: values}`` (the ``section`` name and its ``values``) in the ``metrics.json`` at
    ``path`` (other sections are kept); returns ``path``."""
    path = Path(path)
    data = json.loads(path.read_text()) if path.is_file() else {}
    data[section] = values
    return write_json_atomic(data, path)
