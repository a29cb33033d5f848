"""The base of every task's LightningModule: the ``compile`` option, shared by all of them."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.utilities import rank_zero_info


class TaskModule(pl.LightningModule):
    """A LightningModule whose ``configure_model`` builds ``self.model`` and then calls :meth:`compile_model`.

    ``compile``: ``True`` runs the model's forward pass (backbone, neck, transformer, heads) through
    ``torch.compile`` with its defaults (inductor); a dict gives ``torch.compile``'s keyword arguments
    instead (``{backend: aot_eager}``, ``{mode: max-autotune}``, ``{dynamic: true}``). Training and
    validation then run the compiled forward; the loss (matching, criterion) and post-processing are
    other methods of the model and stay eager. The model is compiled in place, so its parameters and
    state-dict keys, and the checkpoints, are those of the eager model.
    """

    def __init__(self, compile: bool | dict[str, Any] = False) -> None:
        super().__init__()
        if not isinstance(compile, (bool, dict)):
            raise ValueError(f"vision_tx/lightning/task.py: compile must be true, false or a dict of torch.compile arguments, got {compile!r}")
        self.compile_options: dict[str, Any] | None = ({} if compile is True else dict(compile)) if compile else None

    def compile_model(self) -> None:
        """Compiles ``self.model``'s forward pass in place when the ``compile`` option asks for it."""
        if self.compile_options is not None:
            self.model.compile(**self.compile_options)
            rank_zero_info(f"model forward compiled with torch.compile({self.compile_options or ''})")
