"""Planted bugs in the task modules and the command line: validation classes, step schedules, TensorBoard, packaging (see ``tests/mutants/__init__.py``)."""

from tests.mutants.mutant import Mutant
from tests.mutants.targets import CLI_MODEL_OPTIONS, CLI_OVER_CHECKPOINT, CLI_WITHOUT_ARGS, DISTILLATION, EVERY_LAST_CKPT, IMAGEFOLDER, LAST_CKPT, LAST_CKPT_AT_END, SHAPES, SHARE_FROM_EPOCH, STEP_SCHEDULE

MUTANTS = [
    # Classes a validation run scores against; the step schedule of runs budgeted in steps
    Mutant("imagefolder: validation alone takes the validation folders as the classes", "vision_tx/data/imagefolder.py",
           "self.class_names = tuple(find_classes(str(self.class_folder))[0])",
           "self.class_names = None", (IMAGEFOLDER,)),
    Mutant("distillation: the two terms' weights swapped", "vision_tx/lightning/classification.py",
           '(1 - hp.distillation_weight) * losses["class"] + hp.distillation_weight * losses["distillation"]',
           'hp.distillation_weight * losses["class"] + (1 - hp.distillation_weight) * losses["distillation"]', (DISTILLATION,)),
    Mutant("detection: step schedule drops one step late", "vision_tx/lightning/detection.py",
           "MultiStepLR(optimizer, [hp.lr_drop_steps], gamma=0.1)", "MultiStepLR(optimizer, [hp.lr_drop_steps + 1], gamma=0.1)",
           (STEP_SCHEDULE,)),
    Mutant("share_scores_from_epoch: the switch one step late", "vision_tx/lightning/detection.py",
           "if epochs >= start:", "if epochs > start:", (SHARE_FROM_EPOCH,)),
    Mutant("share_scores_from_epoch: the switch not recorded for the checkpoint", "vision_tx/lightning/detection.py",
           '"share_scores": True}', '"share_scores": False}', (SHARE_FROM_EPOCH,)),
    Mutant("share_scores_from_epoch: accumulated batches not counted", "vision_tx/lightning/detection.py",
           "trainer.global_step * trainer.accumulate_grad_batches / trainer.num_training_batches",
           "trainer.global_step / trainer.num_training_batches", (SHARE_FROM_EPOCH,)),
    Mutant("configs: last.ckpt written by the monitored callback (the best weights, not the latest)",
           "vision_tx/configs/rtdetr_convnext_toy.yaml", "        mode: max\n", "        mode: max\n        save_last: true\n",
           (LAST_CKPT, EVERY_LAST_CKPT)),
    Mutant("configs: dino_swin_toy back on the official cell shares", "vision_tx/configs/dino_swin_toy.yaml",
           "      exact_valid_ratios: true", "      exact_valid_ratios: false",
           ("tests/lightning/test_configs.py::test_dino_swin_toy_reads_each_level_at_the_pixel_a_box_names",)),
    Mutant("configs: detr_swin_t writes no last.ckpt", "vision_tx/configs/detr_swin_t.yaml",
           "    - class_path: vision_tx.lightning.callbacks.LatestCheckpoint", "    - class_path: vision_tx.lightning.callbacks.RandomStateCheckpoint",
           (EVERY_LAST_CKPT,)),
    Mutant("LatestCheckpoint: nothing written when training ends", "vision_tx/lightning/callbacks.py",
           "        if not self._should_skip_saving_checkpoint(trainer):  # skipped", "        if False:  # skipped", (LAST_CKPT_AT_END,)),
    Mutant("LatestCheckpoint: the latest weights under another name than last.ckpt", "vision_tx/lightning/callbacks.py",
           'filename="last"', 'filename="latest"', (LAST_CKPT, LAST_CKPT_AT_END)),
    Mutant("held-out shapes: --background plain draws the textured background", "scripts/make_shapes_dataset.py",
           'BACKGROUNDS = {"textured": _background, "plain": _plain_background}',
           'BACKGROUNDS = {"textured": _background, "plain": _background}', (SHAPES,)),
    # The command line over a checkpoint's hyperparameters
    Mutant("cli: the checkpoint's model options kept over the command line's", "vision_tx/lightning/cli.py",
           "                from_checkpoint[name] = value\n", "                pass\n", (CLI_OVER_CHECKPOINT,)),
    Mutant("cli: a dict from the command line replaces the checkpoint's", "vision_tx/lightning/cli.py",
           "value = {**from_checkpoint[name], **value}", "value = value", (CLI_OVER_CHECKPOINT,)),
    Mutant("cli: --model.NAME=VALUE not read", "vision_tx/lightning/cli.py",
           'arg.removeprefix("--model.").partition("=")[0]', 'arg.removeprefix("--model.")', (CLI_OVER_CHECKPOINT, CLI_MODEL_OPTIONS)),
    Mutant("cli: a CLI without args reads no command line", "vision_tx/lightning/cli.py",
           "        return sys.argv[1:]\n", "        return []\n", (CLI_WITHOUT_ARGS,)),
    # Packaging: the configs travel in the wheel
    Mutant("install: the configs left out of the wheel", "pyproject.toml",
           'vision_tx = ["configs/*.yaml"]', "vision_tx = []", ("tests/test_install.py",)),
    # What each validation shows in TensorBoard (the task modules' shared report)
    Mutant("report: classification's pictures drawn as the ground truth", "vision_tx/lightning/classification.py",
           "self.preview.append(draw_top_classes(", "self.preview_truth.append(draw_top_classes(",
           ("tests/lightning/test_tensorboard.py::test_run_shows_its_curves_pictures_and_tables[classification]",)),
]
