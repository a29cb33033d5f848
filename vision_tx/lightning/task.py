"""The base of every task's LightningModule: the ``compile`` option, the check that the data's labels
fit the model, and what each validation reports (pictures, per-category tables), shared by all of them."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities import rank_zero_info

from vision_tx.data.invalid import InvalidDataError


class TaskModule(pl.LightningModule):
    """A LightningModule whose ``configure_model`` builds ``self.model`` and then calls :meth:`compile_model`.

    ``compile``: ``True`` runs the model's forward pass (backbone, neck, transformer, heads) through
    ``torch.compile`` with its defaults (inductor); a dict gives ``torch.compile``'s keyword arguments
    instead (``{backend: aot_eager}``, ``{mode: max-autotune}``, ``{dynamic: true}``). Training and
    validation then run the compiled forward; the loss (matching, criterion) and post-processing are
    other methods of the model and stay eager. The model is compiled in place, so its parameters and
    state-dict keys, and the checkpoints, are those of the eager model.

    Before training and before each validation, the datamodule's largest label (``label_extent()``: the
    file that defines the labels, the id and its name) must be one the model predicts (below
    ``hparams.num_classes``): a checkpoint meeting other data is an ``InvalidDataError`` naming them.

    What ``ValidationReport`` shows of each validation, emptied when it starts and filled by the task:
    ``preview`` (the first validation images, ``[3,H,W]`` uint8, with the predictions drawn),
    ``preview_truth`` (the same images with the ground truth, where the task draws it) and
    ``per_category_tables`` (``{TensorBoard tag: Markdown table}``).
    """

    def __init__(self, compile: bool | dict[str, Any] = False) -> None:
        super().__init__()
        if not isinstance(compile, (bool, dict)):
            raise ValueError(
                f"{__name__}: compile must be true, false or a dict of torch.compile arguments, got {compile!r}"
            )
        self.compile_options: dict[str, Any] | None = ({} if compile is True else dict(compile)) if compile else None
        self.preview: list[torch.Tensor] = []
        self.preview_truth: list[torch.Tensor] = []
        self.per_category_tables: dict[str, str] = {}
        self.training_losses: dict[str, torch.Tensor] | None = None

    def compile_model(self) -> None:
        """Compiles ``self.model``'s forward pass in place when the ``compile`` option asks for it."""
        if self.compile_options is not None:
            self.model.compile(**self.compile_options)
            rank_zero_info(f"model forward compiled with torch.compile({self.compile_options or ''})")

    def log_training_losses(self, losses: dict[str, torch.Tensor], batch_size: int) -> None:
        """Logs the step's ``losses`` (``{name: scalar}``, ``loss`` the total) as ``train/<name>``, shows ``loss`` on
        the progress bar, and keeps them as ``training_losses`` (``{"train/<name>": detached scalar}``, every step:
        ``NonFiniteLossGuard`` names the bad terms from it).

        ``train/loss`` is logged every step (callbacks can monitor it); the other terms only on the steps the loggers
        write (every ``log_every_n_steps``), since Lightning's bookkeeping costs about a millisecond a key and a step
        (25 keys for a detector) and the other steps' values would not be written.
        """
        self.training_losses = {f"train/{name}": value.detach() for name, value in losses.items()}
        writes = self._trainer is None or self.trainer._logger_connector.should_update_logs
        logged = self.training_losses if writes else {"train/loss": self.training_losses["train/loss"]}
        self.log_dict(logged, batch_size=batch_size)
        self.log("loss", losses["loss"], prog_bar=True, logger=False, batch_size=batch_size)

    def check_labels_fit(self) -> None:
        """Raises ``InvalidDataError`` when the datamodule holds labels beyond the model's classes."""
        datamodule = self.trainer.datamodule if self._trainer is not None else None
        extent = getattr(datamodule, "label_extent", None)
        num_classes = self.hparams.get("num_classes")
        if extent is None or num_classes is None:
            return
        source, largest, name = extent()
        if largest >= num_classes:
            raise InvalidDataError(
                f"{source}: label {largest} ({name}) is beyond this model's {num_classes} classes "
                f"(0-{num_classes - 1}): the checkpoint or num_classes was made for other data"
            )

    def on_fit_start(self) -> None:
        self.check_labels_fit()

    def on_validation_start(self) -> None:
        self.check_labels_fit()

    def on_validation_epoch_start(self) -> None:
        self.preview, self.preview_truth, self.per_category_tables = [], [], {}
