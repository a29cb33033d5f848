"""Lightning checkpoint writing that never leaves a truncated file behind, and reading that executes
nothing and names the file in every error."""

from __future__ import annotations

from typing import Any

from fsspec.implementations.local import LocalFileSystem
from lightning.fabric.utilities.cloud_io import get_filesystem
from lightning.pytorch.plugins.io import TorchCheckpointIO
from torch import nn

from vision_tx.checkpoint import read_training_checkpoint, save_atomic


class AtomicCheckpointIO(TorchCheckpointIO):
    """Writes local checkpoints with :func:`vision_tx.checkpoint.save_atomic`: a temporary file in the
    checkpoint's own folder, flushed to disk, then renamed over the old file.

    Lightning's own writer stages the file in the system temporary folder and moves it, which is a
    copy (not atomic) when that folder is on another file system. Remote paths (``s3://``...) are
    left to Lightning. Local checkpoints are read with
    :func:`vision_tx.checkpoint.read_training_checkpoint` (``weights_only``; a corrupt, truncated or
    untrusted file, or one of another model than ``model``, is an error naming the file).
    """

    model: nn.Module | None = None  # the LightningModule a loaded checkpoint must fit (set by the CLI)

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
        if storage_options is not None or not isinstance(get_filesystem(path), LocalFileSystem):
            return super().save_checkpoint(checkpoint, path, storage_options)
        save_atomic(checkpoint, path)

    def load_checkpoint(
        self, path: Any, map_location: Any | None = None, weights_only: bool | None = None
    ) -> dict[str, Any]:
        if not isinstance(get_filesystem(path), LocalFileSystem):
            return super().load_checkpoint(path, map_location, weights_only)
        return read_training_checkpoint(path, self.model)
