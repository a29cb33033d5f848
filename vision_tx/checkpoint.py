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
from pathlib import Path
from typing import Any, Mapping

import torch


class CheckpointError(RuntimeError):
    """A weight file that cannot be used: missing, corrupt, untrusted or of another model."""


def read_checkpoint(path: str | os.PathLike) -> Any:
    """Loads a checkpoint file on the CPU with ``weights_only=True``; errors name the file."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such checkpoint file")
    if path.stat().st_size == 0:
        raise CheckpointError(f"{path}: the file is empty")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        raise CheckpointError(
            f"{path}: refused: the file holds Python objects other than tensors and plain containers, "
            f"and loading it would execute code ({err}). Re-save only its state dict."
        ) from err
    except (RuntimeError, EOFError, zipfile.BadZipFile, ValueError, OSError, IndexError, KeyError, AttributeError) as err:
        raise CheckpointError(f"{path}: not a readable PyTorch checkpoint, corrupt or truncated ({err})") from err


def save_atomic(obj: Any, path: str | os.PathLike) -> None:
    """``torch.save`` to a temporary file beside ``path``, then an atomic rename onto it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def unwrap_state_dict(obj: Any, source: str) -> dict[str, torch.Tensor]:
    """Finds the state dict inside the usual containers (``model``, ``state_dict``, ``model_ema``).

    Lightning checkpoints (``state_dict`` with a ``model.`` prefix) and DDP prefixes (``module.``)
    are unwrapped too.
    """
    if isinstance(obj, Mapping):
        for key in ("state_dict", "model", "model_ema", "module"):
            if key in obj and isinstance(obj[key], Mapping):
                return unwrap_state_dict(obj[key], source)
        if obj and all(isinstance(v, torch.Tensor) for v in obj.values()):
            state = dict(obj)
            for prefix in ("module.", "model."):
                if all(k.startswith(prefix) for k in state):
                    state = {k[len(prefix):]: v for k, v in state.items()}
            return state
    raise CheckpointError(f"{source}: holds no state dict (expected a mapping of names to tensors)")
