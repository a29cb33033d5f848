"""Reading and writing weight files safely.

Every checkpoint is read with ``weights_only=True`` (nothing in it is executed) and written
atomically (to a temporary file in the same folder, then renamed), so a crash never leaves a
truncated file behind.
"""

from __future__ import annotations

import os
import pickle
import tempfile
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn


class CheckpointError(RuntimeError):
    """A weight file that cannot be used: missing, corrupt, untrusted or of another model."""


def read_checkpoint(path: str | os.PathLike, mmap: bool = False) -> Any:
    """Loads the checkpoint file at ``path`` on the CPU with ``weights_only=True``; errors name the file.

    ``mmap=True`` maps the tensors' bytes instead of reading them (a check of the file's structure,
    keys and shapes that costs almost nothing); it applies to the zip format that ``torch.save``
    has written since torch 1.6, older files are read whole.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such checkpoint file")
    if path.stat().st_size == 0:
        raise CheckpointError(f"{path}: the file is empty")
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap and zipfile.is_zipfile(path))
    except pickle.UnpicklingError as err:
        # The weights_only unpickler names each object it refuses as a GLOBAL; other complaints
        # (unknown opcodes) come from bytes that are no pickle at all.
        refused = [line.strip() for line in str(err).splitlines() if "GLOBAL" in line]
        if not refused:
            raise CheckpointError(
                f"{path}: not a readable PyTorch checkpoint, corrupt or truncated (no pickle in it)"
            ) from err
        raise CheckpointError(
            f"{path}: refused: the file holds Python objects other than tensors and plain containers, "
            f"and loading it would execute code ({refused[0]}). Re-save only its state dict."
        ) from err
    except (
        RuntimeError,
        EOFError,
        zipfile.BadZipFile,
        ValueError,
        OSError,
        IndexError,
        KeyError,
        AttributeError,
    ) as err:
        raise CheckpointError(f"{path}: not a readable PyTorch checkpoint, corrupt or truncated ({err})") from err


def read_training_checkpoint(
    path: str | os.PathLike, model: nn.Module | None = None, mmap: bool = False
) -> dict[str, Any]:
    """A training checkpoint at ``path`` (Lightning's, as ``tools/train.py`` writes) read with :func:`read_checkpoint`
    (``mmap`` as there).

    Refuses files that hold no training state and, given ``model``, weights that do not fit it
    exactly (a checkpoint of another model or variant); errors name the file.
    """
    checkpoint = read_checkpoint(path, mmap=mmap)
    if not isinstance(checkpoint, Mapping) or not {"state_dict", "pytorch-lightning_version"} <= set(checkpoint):
        held = sorted(checkpoint)[:6] if isinstance(checkpoint, Mapping) else type(checkpoint).__name__
        raise CheckpointError(
            f"{path}: not a training checkpoint written by tools/train.py (Lightning): it holds {held}. "
            "To start from plain weights, give them to the model's pretrained or weights option instead"
        )
    if model is not None:
        missing, unexpected = fit_state_dict(checkpoint["state_dict"], model, str(path))
        if (missing or unexpected) and getattr(model, "strict_loading", True):
            raise CheckpointError(
                f"{path}: does not fit this {type(model).__name__}, so it is a checkpoint of another model or "
                f"variant: {_key_list('missing', missing)}{_key_list('unexpected', unexpected)}"
            )
    return dict(checkpoint)


def fit_state_dict(state: Mapping[str, torch.Tensor], model: nn.Module, source: str) -> tuple[list[str], list[str]]:
    """Checks that ``state`` is a state dict of ``model``'s kind: raises ``CheckpointError`` naming
    ``source`` when shapes differ or no key matches; returns the keys missing from ``state`` and
    those ``model`` lacks (both sorted)."""
    expected = model.state_dict()
    mismatched = [
        f"{k} (checkpoint {tuple(v.shape)}, model {tuple(expected[k].shape)})"
        for k, v in state.items()
        if k in expected and v.shape != expected[k].shape
    ]
    if mismatched:
        raise CheckpointError(
            f"{source}: shapes differ from this {type(model).__name__}, so it is a checkpoint of "
            f"another model or variant: {'; '.join(mismatched[:5])}" + (" ..." if len(mismatched) > 5 else "")
        )
    if not any(k in expected for k in state):
        raise CheckpointError(
            f"{source}: none of its {len(state)} tensors match this {type(model).__name__} "
            f"(first keys: {', '.join(list(state)[:3])}); it is a checkpoint of another model"
        )
    return sorted(set(expected) - set(state)), sorted(set(state) - set(expected))


def _key_list(what: str, keys: list[str]) -> str:
    if not keys:
        return ""
    return f"{len(keys)} {what} keys ({', '.join(keys[:3])}{', ...' if len(keys) > 3 else ''}) "


def save_atomic(obj: Any, path: str | os.PathLike) -> None:
    """``torch.save`` of ``obj`` to a temporary file beside ``path``, then an atomic rename onto it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
            os.fchmod(f.fileno(), 0o666 & ~_umask())  # mkstemp's file is private; a plain open's is not
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask


def unwrap_state_dict(obj: Any, source: str) -> dict[str, torch.Tensor]:
    """Finds the state dict in ``obj`` inside the usual containers (``model``, ``state_dict``, ``model_ema``, ``ema``);
    errors name ``source`` (the file, or ``"<state dict>"``).

    Lightning checkpoints (``state_dict`` with a ``model.`` prefix) and DDP prefixes (``module.``)
    are unwrapped too.
    """
    if isinstance(obj, Mapping):
        for key in ("state_dict", "model", "model_ema", "ema", "module"):
            if key in obj and isinstance(obj[key], Mapping):
                return unwrap_state_dict(obj[key], source)
        if obj and all(isinstance(v, torch.Tensor) for v in obj.values()):
            state = dict(obj)
            for prefix in ("module.", "model."):
                if all(k.startswith(prefix) for k in state):
                    state = {k[len(prefix) :]: v for k, v in state.items()}
            return state
    raise CheckpointError(f"{source}: holds no state dict (expected a mapping of names to tensors)")
