"""Plants single-line bugs one at a time in a temporary copy of the checkout and runs the tests meant to catch them.

Each mutant is one plausible bug of the kinds a parity claim must rule out: a swapped, skipped or
dropped norm, a bias not loaded, an activation added or removed, a bias table transposed or flipped,
a threshold moved. A mutant that no test kills ("SURVIVED") means a claim the suite does not back.
Not part of the test suite: run it after adding a parity claim, and add a mutant for it (see
docs/TESTING.md).

    python scripts/mutants.py                 # every mutant
    python scripts/mutants.py --only swin     # mutants whose name contains "swin"
    python scripts/mutants.py --list
    python scripts/mutants.py --jobs 2       # two at once, each in its own copy
    python scripts/mutants.py --shard 1/2    # every second mutant from the first (--shard 2/2: the others)
    python scripts/mutants.py --shard 2/2 --slice 70:   # that shard from its 71st mutant on
"""

from __future__ import annotations

import argparse
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SWIN_TIMM = "tests/backbones/test_swin.py::test_timm_weights_give_timm_logits[swin_t]"
NAT = "tests/backbones/test_nat_official.py"  # the independent NAT reference (tests/backbones/nat_reference.py)
NA2D = "tests/ops/test_na2d.py"
RESNET = "tests/models/test_detr.py::test_resnet_reads_torchvision_weights"
DETR = "tests/models/test_detr.py::test_outputs_and_loss_match_transformers"
DETR_PANOPTIC = "tests/models/test_detr_panoptic.py"
MASK_HEAD = "tests/heads/test_detr_mask_head.py"
UPERNET = "tests/heads/test_upernet.py"
RESIZE_CONV = "tests/ops/test_resize_concat_conv.py"
PQ = "tests/metrics/test_panoptic_rules.py"
COCO = "tests/metrics/test_coco_rules.py"
MSDA = "tests/ops/test_ms_deform_attn.py"
FFN = "tests/ops/test_feed_forward.py"
LINEAR_TRAINING = "tests/ops/test_linear_autograd.py"
ONEDNN = "tests/ops/test_onednn.py"
DINO_FFN = "tests/ops/test_feed_forward.py::test_dino_block_is_the_post_norm_ffn_with_and_without_dropout"
DINO_TX = "tests/models/test_dino.py::test_outputs_and_loss_match_transformers"
DINO_TX_GRAD = "tests/models/test_dino.py::test_gradients_match_transformers"
DINO_LFT = "tests/models/test_dino.py::test_look_forward_twice_trains_the_previous_layer_and_no_earlier_one"
DINO_NORM = "tests/models/test_dino.py::test_the_heads_read_each_layer_through_the_final_norm_and_references_do_not"
DINO_MIXED = "tests/models/test_dino.py::test_mixed_selection_and_query_positions_follow_the_paper"
DINO_DN_MASK = "tests/models/test_dino.py::test_denoising_groups_see_no_other_group_and_matching_queries_see_none"
DINO_DN_NOISE = "tests/models/test_dino.py::test_denoising_positives_lie_within_the_noise_scale_and_negatives_beyond"
DINO_DN_LOSS = "tests/models/test_dino.py::test_denoising_losses_are_per_target_and_group"
DINO_OFFICIAL = "tests/models/test_dino_official.py"
DN_GROUPS = "tests/heads/test_dino_denoising.py::test_group_count_is_the_official_dn_number"
DN_CLAMP = "tests/heads/test_dino_denoising.py::test_noised_boxes_are_clamped_and_stored_through_the_inverse_sigmoid"
DN_RT_DETR = "tests/heads/test_dino_denoising.py::test_queries_are_transformers_rt_detr_contrastive_denoising_groups"
DN_MASK_BOTH = "tests/heads/test_dino_denoising.py::test_attention_mask_in_both_directions"
DINO_DEFAULTS = "tests/models/test_dino.py::test_defaults_are_the_official_dino_4scale_config"
DINO_LEVEL_PIXELS = "tests/models/test_dino.py::test_exact_valid_ratios_place_every_level_on_the_pixels_its_cells_cover"
COPY_PASTE_DATA = "tests/data/test_detection.py::test_copy_paste_reads_the_masks_and_cuts_along_the_boxes_when_an_object_has_none"
DINO_ALL_LOSSES = "tests/models/test_dino.py::test_every_loss_term_of_mixed_selection_by_hand"
FINETUNE_DETR = "tests/lightning/test_finetuning.py::test_detr_weights_of_another_class_count"
FINETUNE_DINO = "tests/lightning/test_finetuning.py::test_dino_weights_of_another_class_count"
FINETUNE_UPERNET = "tests/lightning/test_finetuning.py::test_upernet_weights_of_another_class_count"
FINETUNE_CLASSIFIER = "tests/lightning/test_finetuning.py::test_classifier_pretrained_of_another_class_count"
FINETUNE_OFFICIAL = "tests/lightning/test_finetuning_official.py"
FINETUNE_RTDETR = f"{FINETUNE_OFFICIAL}::test_rtdetr_weights_of_another_class_count"
FINETUNE_M2F = f"{FINETUNE_OFFICIAL}::test_mask2former_weights_of_another_class_count"
FINETUNE_ONE_MORE = f"{FINETUNE_OFFICIAL}::test_one_class_more_than_the_checkpoint_keeps_its_label_embeddings"
FINETUNE_TWO_STEPS = f"{FINETUNE_OFFICIAL}::test_two_training_steps_from_an_official_checkpoint_of_another_class_count"
OFFICIAL_DEFAULTS = "tests/models/test_official_defaults.py"
LABEL_RANGE = "tests/lightning/test_label_range.py"
LABEL_RANGE_EVAL = "tests/lightning/test_label_range.py::test_evaluating_a_checkpoint_on_other_data_is_one_line"
RT_TX = "tests/models/test_rtdetr.py::test_encoder_proposals_and_decoder_match_transformers"
RT_TRAIN = "tests/models/test_rtdetr.py::test_training_outputs_and_loss_match_transformers"
RT_GRAD = "tests/models/test_rtdetr.py::test_gradients_match_transformers"
RT_POSITION = "tests/models/test_rtdetr.py::test_position_embedding_is_transformers_2d_sincos"
RT_PADDING = "tests/models/test_rtdetr.py::test_aifi_hides_padding_the_cropped_map_sees_the_same"
RT_LFT = "tests/models/test_rtdetr.py::test_look_forward_twice_trains_the_previous_layers_box_head"
RT_OFFICIAL = "tests/models/test_rtdetr_official.py"
RT_DENOISING = "tests/models/test_rtdetr.py::test_denoising_queries_are_transformers_groups_as_the_decoder_reads_them"
DFINE_W = "tests/models/test_dfine.py::test_weighting_function_and_fgl_targets_are_transformers"
DFINE_TX = "tests/models/test_dfine.py::test_decoder_layers_match_transformers"
DFINE_LOSS = "tests/models/test_dfine.py::test_losses_match_transformers"
DFINE_OFFICIAL = "tests/models/test_dfine_official.py"
PROTOCOL_KWARGS = "tests/models/test_detectors.py::test_class_attributes_and_kwargs_reach_the_matcher_and_criterion"
PROTOCOL_TARGETS = "tests/models/test_detectors.py::test_training_reads_the_pipelines_targets"
PROTOCOL_OUTPUTS = "tests/models/test_detectors.py::test_postprocessing_and_cross_attention"
PROTOCOL_SHARE = "tests/models/test_detectors.py::test_share_scores_reach_the_post_processing"
VIT = "tests/backbones/test_vit.py::test_timm_weights_give_timm_logits"
VIT_WEIGHTS = "tests/backbones/test_vit.py::test_attention_weights_are_the_ones_the_forward_uses"
VIT_RESIZE = "tests/backbones/test_vit.py::test_resize_pos_embed_is_timms_bicubic_resampling"
PYRAMID = "tests/backbones/test_vit.py::test_pyramid_is_the_vitdet_simple_feature_pyramid"
CONVNEXT = "tests/backbones/test_convnext.py::test_timm_weights_give_timm_logits"
CONVNEXT_DENSE = "tests/backbones/test_convnext.py::test_dense_outputs_are_timms_stage_outputs_through_the_output_norms"
CONVNEXT_SMALL_DATA = "tests/backbones/test_convnext.py::test_small_data_variant_is_its_description"
CONVNEXT_SMALL_DATA_DENSE = "tests/backbones/test_convnext.py::test_small_data_dense_outputs_are_its_stage_maps_through_batchnorm"
CONVNEXT_SYNC_BN = "tests/backbones/test_convnext.py::test_small_data_variant_survives_sync_batchnorm_conversion"
CONVNEXT_RUNNING_STATISTICS = "tests/backbones/test_convnext.py::test_small_data_running_statistics_after_training_steps_are_the_by_hand_update"
MIXER = "tests/backbones/test_mixer.py::test_timm_weights_give_timm_logits"
SAM = "tests/optim/test_sam.py"
SAM_DDP = "tests/lightning/test_ddp.py::test_sam_classification_trains_the_same_on_two_processes"
DISTILLATION = "tests/lightning/test_classification.py::test_hard_distillation_is_half_ce_on_the_labels_and_half_ce_on_the_teachers_argmax"
TORCHVISION_TEACHER = "tests/lightning/test_classification.py::test_torchvision_teacher_is_read_from_its_path_frozen_in_eval_mode"
ROLLOUT = "tests/test_attention.py::test_rollout_of_a_two_layer_two_head_model_is_the_computation_by_hand"
ATTN_WEIGHTS = "tests/test_attention.py::test_attention_weights_follow_the_masks_of_sdpa"
DETR_ATTN = "tests/test_attention.py::test_detr_cross_attention_is_torchs_head_averaged_attention"
SPLAT = "tests/test_attention.py::test_splat_is_the_adjoint_of_grid_sample"
DINO_ATTN = "tests/test_attention.py::test_dino_cross_attention_draws_the_last_layers_sampling_weights_per_query"
DINO_POSTPROCESS = "tests/heads/test_detr_postprocess.py::test_sigmoid_detections_match_transformers_deformable_detr"
DINO_NMS = "tests/heads/test_detr_postprocess.py::test_sigmoid_detections_nms_drops_same_class_duplicates_above_the_threshold_only"
SHARED_SCORES = "tests/heads/test_detr_postprocess.py::test_shared_scores_are_each_class_probability_times_its_share_of_the_query"
SHARED_TORN = "tests/heads/test_detr_postprocess.py::test_shared_scores_keep_a_confident_query_and_lower_a_torn_one"
CLASSWISE = "tests/metrics/test_coco_eval.py::test_per_category_ap_is_pycocotools_precision_per_category"
IMAGEFOLDER = "tests/data/test_imagefolder.py"
STEP_SCHEDULE = "tests/lightning/test_detection.py::test_step_schedule_drops_tenfold_once_after_lr_drop_steps"
SHARE_FROM_EPOCH = "tests/lightning/test_detection.py::test_scores_are_shared_once_the_run_has_trained_share_scores_from_epoch"
CLI_OVER_CHECKPOINT = "tests/lightning/test_cli.py::test_model_options_on_the_command_line_win_over_the_checkpoints"
CLI_MODEL_OPTIONS = "tests/lightning/test_cli.py::test_model_options_are_read_in_every_form_the_parser_takes"
CLI_WITHOUT_ARGS = "tests/lightning/test_cli.py::test_model_options_are_read_from_the_command_line_lightning_parses"
LAST_CKPT = "tests/lightning/test_configs.py::test_last_ckpt_holds_the_latest_weights_when_the_metric_falls_and_a_run_resumes_from_them"
LAST_CKPT_AT_END = "tests/lightning/test_configs.py::test_last_ckpt_holds_the_final_weights_of_a_run_that_ends_between_validations_or_has_none"
EVERY_LAST_CKPT = "tests/lightning/test_configs.py::test_every_config_keeps_its_best_checkpoint_and_the_latest_as_last_ckpt"
EXPORT = "tests/test_export.py::test_exported_model_in_onnxruntime_gives_the_eager_outputs"
EXPORT_NMS = "tests/test_export.py::test_exported_nms_keeps_the_better_of_two_overlapping_boxes_of_a_class"
EXPORT_EVERY = "tests/scripts/test_export_every_config.py"
EXPORT_NO_OBJECT = "tests/test_export.py::test_exported_detr_never_labels_a_query_no_object"
EXPORT_SHARED = "tests/test_export.py::test_exported_shared_scores_are_the_eager_ones"
EXPORT_TOOL_PANOPTIC = "tests/lightning/test_panoptic.py::test_export_tool_writes_the_trained_panoptic_model_with_the_datamodules_things"
EXPORT_DETR_PANOPTIC = "tests/test_export.py::test_exported_detr_panoptic_drops_small_segments_as_the_eager_loop"
NO_DECAY = "tests/backbones/test_no_weight_decay.py::test_every_backbone_and_classifier_names_its_exempt_parameters"
NO_DECAY_GROUPS = "tests/lightning/test_common.py::test_param_groups_follow_no_weight_decay"
TASK_DECAY = "tests/lightning/test_common.py::test_every_task_decays_norms_and_biases_as_its_option_says"
FUSED_ADAMW = "tests/lightning/test_common.py::test_every_task_fuses_adamw_unless_lightning_mixes_precision"
SHAPES = "tests/scripts/test_make_shapes_dataset.py::test_plain_backgrounds_are_one_colour_and_textured_ones_are_not"
MOSAIC = "tests/data/test_mosaic.py"
COCO_INSTANCES = "tests/data/test_coco_instances.py"
M2F = "tests/models/test_mask2former.py::test_pixel_decoder_and_every_prediction_match_transformers"
M2F_LOSS = "tests/models/test_mask2former.py::test_loss_and_gradients_match_transformers"
M2F_MASKED = "tests/models/test_mask2former.py::test_masked_attention_restricts_each_query"
M2F_SEMANTIC = "tests/heads/test_mask2former_postprocess.py::test_semantic_matches_transformers"
M2F_PANOPTIC = "tests/heads/test_mask2former_postprocess.py::test_panoptic_matches_transformers"
M2F_PANOPTIC_RULES = "tests/heads/test_mask2former_postprocess.py::test_panoptic_paper_rules"
M2F_INSTANCE = "tests/heads/test_mask2former_postprocess.py::test_instances_match_transformers"
M2F_OFFICIAL = "tests/models/test_mask2former_official.py"
M2F_NUM_MASKS = "tests/models/test_mask2former.py::test_loss_divides_by_the_mask_count_of_the_whole_distributed_batch"
M2F_OBJECT_THRESHOLD = "tests/heads/test_mask2former_postprocess.py::test_panoptic_object_threshold_is_the_given_one"
M2F_PADDING = "tests/models/test_mask2former_padding.py"
YOLO_LABELS = "tests/scripts/test_compare_detection.py"
LONG_RUN_AUGMENTATION = "tests/lightning/test_augmentation.py"
SHAPES_CLASSIFICATION = "tests/scripts/test_make_shapes_classification.py"
TRAINING_BUDGET = "tests/lightning/test_budget.py"
MAL = "tests/heads/test_rtdetr_criterion.py"
BOX_REFINEMENT = "tests/heads/test_rtdetr_box_refinement.py"
RT_REFINEMENT = "tests/models/test_rtdetr.py::test_box_refinement_refines_the_last_layers_detached_boxes_from_the_finest_memory"
LEVEL_PIXELS = "tests/necks/test_multiscale.py"
RT_LEVEL_PIXELS = "tests/models/test_rtdetr.py::test_memory_levels_and_proposal_anchors_name_each_tokens_pixel"
CROP_PROBABILITY = "tests/data/test_transforms.py::test_crop_probability_is_the_share_of_cropped_images"
AFFINE = "tests/data/test_transforms.py"
CHANNEL_PERMUTATION = "tests/data/test_transforms.py::test_channel_permutation_reorders_the_colours_and_leaves_the_boxes"
VERTICAL_FLIP = "tests/data/test_transforms.py::test_flip_and_turn_move_the_image_its_canvas_and_the_boxes_together[vertical_flip]"
QUARTER_TURN = "tests/data/test_transforms.py::test_flip_and_turn_move_the_image_its_canvas_and_the_boxes_together[quarter_turn]"
BENCHMARK_PEAKS = "tests/test_benchmark_gpu_paths.py"
LAYOUTS = "tests/data/test_yolo_voc.py"
DEPLOY = "tests/test_deploy.py"
PREDICT = "tests/lightning/test_predict.py"
DETECTION_REPORT = "tests/metrics/test_detection_report.py"


@dataclass(frozen=True)
class Mutant:
    name: str
    path: str  # relative to the checkout
    before: str  # must occur exactly once in the file
    after: str
    tests: tuple[str, ...]  # pytest node ids: only these run


MUTANTS = [
    # Swin
    Mutant("swin: norm1 and norm2 swapped", "vision_tx/backbones/swin.py",
           "self._window_attention(self.norm1(t), attn_mask)", "self._window_attention(self.norm2(t), attn_mask)", (SWIN_TIMM,)),
    Mutant("swin: bias table transposed (query/key)", "vision_tx/backbones/swin.py",
           "return bias.permute(2, 0, 1).contiguous()", "return bias.permute(2, 1, 0).contiguous()", (SWIN_TIMM,)),
    Mutant("swin: patch-merging norm dropped", "vision_tx/backbones/swin.py",
           "return self.reduction(self.norm(x))", "return self.reduction(x)", (SWIN_TIMM,)),
    Mutant("swin: MLP GELU removed", "vision_tx/backbones/layers.py",
           'self.fc1 = Linear(dim, hidden, activation="gelu")', "self.fc1 = Linear(dim, hidden)", (SWIN_TIMM,)),
    Mutant("swin: bf16 attention without its 1/sqrt(d) scale", "vision_tx/backbones/swin.py",
           "scores = torch.matmul(q * q.shape[-1] ** -0.5, k.transpose(-2, -1))", "scores = torch.matmul(q, k.transpose(-2, -1))",
           ("tests/backbones/test_swin.py::test_bf16_autocast_stays_close_to_fp32",)),
    Mutant("swin: attention proj bias not loaded", "vision_tx/backbones/swin.py",
           'if key.endswith(("relative_position_index", "attn_mask")):',
           'if key.endswith(("relative_position_index", "attn_mask", "attn.proj.bias")):', (SWIN_TIMM,)),
    # NAT
    Mutant("nat: GELU added in the stem", "vision_tx/backbones/nat.py",
           "return self.norm(self.proj(images).permute(0, 2, 3, 1))",
           "return self.norm(self.proj[1](F.gelu(self.proj[0](images))).permute(0, 2, 3, 1))", (NAT,)),
    Mutant("nat: norm1 and norm2 swapped", "vision_tx/backbones/nat.py",
           "self._residual(self.attn(self.norm1(t)), self.gamma1)", "self._residual(self.attn(self.norm2(t)), self.gamma1)", (NAT,)),
    Mutant("nat: downsampler norm dropped", "vision_tx/backbones/nat.py",
           "return self.norm(self.reduction(x.permute(0, 3, 1, 2)).permute(0, 2, 3, 1))",
           "return self.reduction(x.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)", (NAT,)),
    Mutant("na2d: bias table flipped", "vision_tx/ops/neighborhood_attention.py",
           "bias = rpb[:, rows.bias_index][..., cols.bias_index]", "bias = rpb.flip(-1)[:, rows.bias_index][..., cols.bias_index]", (NA2D,)),
    # ResNet (DETR's backbone)
    Mutant("resnet: ReLU after bn1 removed", "vision_tx/backbones/resnet.py",
           "out = F.relu(_conv_norm(block.conv1, block.bn1, x), inplace=True)", "out = _conv_norm(block.conv1, block.bn1, x)", (RESNET,)),
    Mutant("resnet: frozen BN mean not subtracted", "vision_tx/backbones/resnet.py",
           "shift = norm.bias - norm.running_mean * scale", "shift = norm.bias", (RESNET,)),
    # DETR
    Mutant("detr padding: the row positions normalised by the valid width", "vision_tx/necks/position_encoding.py",
           "y = (y + self.offset) / (y[:, -1:, :] + eps) * self.scale", "y = (y + self.offset) / (x[:, :, -1:] + eps) * self.scale",
           (DETR, DINO_TX)),
    Mutant("detr: decoder norm2 and norm3 swapped", "vision_tx/heads/detr/transformer.py",
           "tgt = self.norm2(tgt + self.dropout(attended))", "tgt = self.norm3(tgt + self.dropout(attended))", (DETR,)),
    Mutant("detr: encoder FFN ReLU removed", "vision_tx/heads/detr/transformer.py",
           "return self.norm2(src + self.dropout(self.linear2(self.dropout(F.relu(self.linear1(src))))))",
           "return self.norm2(src + self.dropout(self.linear2(self.dropout(self.linear1(src)))))", (DETR,)),
    Mutant("detr: decoder output norm dropped", "vision_tx/heads/detr/transformer.py",
           "return self.norm(torch.stack(outputs))", "return torch.stack(outputs)", (DETR,)),
    Mutant("detr converter: cross-attention read into self-attention", "vision_tx/models/detr.py",
           'converted[key.replace(".multihead_attn.", ".cross_attn.")] = value',
           'converted[key.replace(".multihead_attn.", ".self_attn.")] = value', (DETR,)),
    Mutant("detr converter: packed q/k/v rows read in k/v/q order", "vision_tx/models/detr.py",
           'converted[key.replace(".multihead_attn.", ".cross_attn.")] = value',
           'converted[key.replace(".multihead_attn.", ".cross_attn.")] = value.roll(-value.shape[0] // 3, 0) if "in_proj" in key else value',
           (DETR, DETR_PANOPTIC)),
    Mutant("detr mask head: ReLU after GroupNorm removed", "vision_tx/heads/detr/mask_head.py",
           "nn.GroupNorm(GROUPS, out_channels), nn.ReLU())", "nn.GroupNorm(GROUPS, out_channels))", (MASK_HEAD,)),
    # UperNet
    Mutant("upernet: ConvBNReLU ReLU removed", "vision_tx/heads/fcn.py",
           "act=nn.ReLU(inplace=True),", "act=nn.Identity(),", (UPERNET,)),
    Mutant("upernet: top-down pathway not added", "vision_tx/heads/upernet.py",
           "laterals[i - 1] = laterals[i - 1] + self._resize(laterals[i], laterals[i - 1].shape[-2:])",
           "laterals[i - 1] = laterals[i - 1]", (UPERNET,)),
    Mutant("upernet: the fusing blocks' BatchNorm skipped", "vision_tx/heads/upernet.py",
           "return block.act(block.bn(fused))", "return block.act(fused)", (UPERNET,)),
    Mutant("segmentor: the loss reads the label map transposed", "vision_tx/models/segmentor.py",
           "F.cross_entropy(pixels, labels.flatten(),", "F.cross_entropy(pixels, labels.transpose(1, 2).flatten(),",
           ("tests/models/test_segmentor.py::test_loss_matches_hand_computation",)),
    Mutant("resize-concat conv: taps shifted the wrong way", "vision_tx/ops/resize_concat_conv.py",
           "torch.stack([padded[t : t + size] for t in range(kernel)], dim=-1)",
           "torch.stack([padded[kernel - 1 - t : kernel - 1 - t + size] for t in range(kernel)], dim=-1)", (RESIZE_CONV, UPERNET)),
    Mutant("resize-concat conv: the kernel's rows and columns swapped", "vision_tx/ops/resize_concat_conv.py",
           "weight.permute(3, 2, 0, 1)", "weight.permute(2, 3, 0, 1)", (RESIZE_CONV, UPERNET)),
    Mutant("resize-concat conv: align_corners ignored", "vision_tx/ops/resize_concat_conv.py",
           'mode="linear", align_corners=align_corners)', 'mode="linear", align_corners=False)', (RESIZE_CONV,)),
    # Panoptic quality
    Mutant("pq: void/crowd threshold 0.5 -> 0.9", "vision_tx/metrics/panoptic.py",
           "if ignored / pred_area[j] <= 0.5:", "if ignored / pred_area[j] <= 0.9:", (PQ,)),
    Mutant("pq: match IoU > 0.5 -> >= 0.5", "vision_tx/metrics/panoptic.py", "if iou > 0.5:", "if iou >= 0.5:", (PQ,)),
    Mutant("pq: crowd regions of every category", "vision_tx/metrics/panoptic.py",
           'for i in crowd_of_category.get(pred["category_id"], ()))',
           "for i in sum(crowd_of_category.values(), []))", (PQ,)),
    Mutant("pq: void pixels kept in the union", "vision_tx/metrics/panoptic.py",
           "iou = inter / (pred_area[j] + gt_area[i] - inter - on_void[j])",
           "iou = inter / (pred_area[j] + gt_area[i] - inter)", (PQ,)),
    # COCO evaluation (pycocotools behind vision_tx's conversion of the predictions)
    Mutant("coco: boxes handed over as xyxy", "vision_tx/metrics/coco.py",
           'result["bbox"] = [x1, y1, x2 - x1, y2 - y1]', 'result["bbox"] = [x1, y1, x2, y2]', (COCO,)),
    Mutant("coco: evaluated over every image, not those seen", "vision_tx/metrics/coco.py",
           "evaluator.params.imgIds = sorted(int(i) for i in image_ids)", "pass", ("tests/metrics/test_coco_eval.py",)),
    # Multi-scale deformable attention (the operator, against transformers' grid_sample version)
    Mutant("ms_deform_attn: half-pixel offset dropped (align_corners=True)", "vision_tx/ops/ms_deform_attn.py",
           "pixel = (locations.to(compute_dtype) * 2 - 1 + 1) * (sizes / 2) - 0.5",
           "pixel = (locations.to(compute_dtype) * 2 - 1 + 1) * (sizes / 2)", (MSDA,)),
    Mutant("ms_deform_attn: x and y of the level size swapped", "vision_tx/ops/ms_deform_attn.py",
           "sizes = torch.stack([width, height], -1).to(compute_dtype)", "sizes = torch.stack([height, width], -1).to(compute_dtype)", (MSDA,)),
    Mutant("ms_deform_attn: bilinear weights read x for y", "vision_tx/ops/ms_deform_attn.py",
           "upper, lower = weight * (1 - fy), weight * fy", "upper, lower = weight * (1 - fx), weight * fx", (MSDA,)),
    Mutant("ms_deform_attn: bordered row width off by one", "vision_tx/ops/ms_deform_attn.py",
           "bordered_width = width + 2", "bordered_width = width + 1", (MSDA,)),
    Mutant("ms_deform_attn: top-right and bottom-left neighbours swapped", "vision_tx/ops/ms_deform_attn.py",
           "torch.ones_like(bordered_width), bordered_width, bordered_width + 1], -1)",
           "bordered_width, torch.ones_like(bordered_width), bordered_width + 1], -1)", (MSDA,)),
    Mutant("ms_deform_attn: level start offsets of the next levels", "vision_tx/ops/ms_deform_attn.py",
           "[(h + 2) * (w + 2) for h, w in shapes[:-1]]", "[(h + 2) * (w + 2) for h, w in shapes[1:]]", (MSDA,)),
    Mutant("ms_deform_attn: samples just outside the border read nothing", "vision_tx/ops/ms_deform_attn.py",
           "touches = ((corner >= -1) & (corner < sizes)).all(-1)", "touches = ((corner >= 0) & (corner < sizes)).all(-1)", (MSDA,)),
    Mutant("ms_deform_attn backward: weight gradient rows swapped", "vision_tx/ops/ms_deform_attn.py",
           "grad_weight = torch.lerp(top, bottom, fy).to(weight.dtype)", "grad_weight = torch.lerp(bottom, top, fy).to(weight.dtype)", (MSDA,)),
    Mutant("ms_deform_attn backward: wrong sign of the y location gradient", "vision_tx/ops/ms_deform_attn.py",
           "grad_frac = torch.stack([grad_fx, weight * (bottom - top)], -1)", "grad_frac = torch.stack([grad_fx, weight * (top - bottom)], -1)", (MSDA,)),
    Mutant("ms_deform_attn backward: value gradient with the wrong corner's weights", "vision_tx/ops/ms_deform_attn.py",
           "per_sample_weights=sorted_weights[corner])", "per_sample_weights=sorted_weights[3 - corner])", (MSDA,)),
    # The fused residual feed-forward block (against autograd through the plain layers)
    Mutant("feed forward: ReLU gradient passes where the output is zero", "vision_tx/ops/feed_forward.py",
           "grad_hidden, hidden, 0.0, grad_input=grad_hidden)", "grad_hidden, hidden, -1.0, grad_input=grad_hidden)", (FFN, DINO_TX_GRAD)),
    Mutant("feed forward: oneDNN's first product without ReLU", "vision_tx/ops/feed_forward.py",
           'hidden = _ONEDNN_LINEAR(rows, weight1, bias1, "relu", [], "")', 'hidden = _ONEDNN_LINEAR(rows, weight1, bias1, "none", [], "")', (FFN,)),
    Mutant("feed forward: second bias dropped", "vision_tx/ops/feed_forward.py",
           "output = (rows + bias2).addmm_(hidden, weight2.t())", "output = rows.clone().addmm_(hidden, weight2.t())", (FFN, DINO_TX)),
    Mutant("feed forward (oneDNN, float32): residual not added to the output", "vision_tx/ops/feed_forward.py",
           'output = _ONEDNN_LINEAR(hidden, weight2, bias2, "none", [], "").add_(rows)', 'output = _ONEDNN_LINEAR(hidden, weight2, bias2, "none", [], "")', (FFN,)),
    Mutant("feed forward (oneDNN, float32): residual gradient dropped", "vision_tx/ops/feed_forward.py",
           "grad_x = product(grad_hidden, weight1).add_(grad) if ctx.onednn", "grad_x = product(grad_hidden, weight1) if ctx.onednn", (FFN,)),
    # The oneDNN training path of the linear layers (against float64 autograd)
    Mutant("linear training: GELU skipped in the forward", "vision_tx/ops/linear_autograd.py",
           "            out = F.gelu(out)", "            out = out", (LINEAR_TRAINING,)),
    Mutant("linear training: bias gradient taken before GELU's gradient", "vision_tx/ops/linear_autograd.py",
           "grad_bias = grad.sum(0) if ctx.needs_input_grad[2]", "grad_bias = grad_output.flatten(0, -2).sum(0) if ctx.needs_input_grad[2]", (LINEAR_TRAINING,)),
    Mutant("linear training: GELU's gradient at the output, not the pre-activation", "vision_tx/ops/linear_autograd.py",
           "grad = torch.ops.aten.gelu_backward(grad, pre)", "grad = torch.ops.aten.gelu_backward(grad, F.gelu(pre))", (LINEAR_TRAINING,)),
    Mutant("linear training: the weight gradient's rows from the input's first rows only", "vision_tx/ops/linear_autograd.py",
           "        return onednn_product(grad.t(), rows)", "        return onednn_product(grad[:1].t(), rows[:1])", (LINEAR_TRAINING,)),
    Mutant("linear training: broadcast (stride-0) gradients handed to oneDNN as they are", "vision_tx/ops/linear_autograd.py",
           "a, b = (t.contiguous() if 0 in t.stride() else t for t in (a, b))", "pass", (LINEAR_TRAINING,)),
    # Where the training products run (oneDNN, or torch's operators on Intel CPUs with MKL)
    Mutant("oneDNN training: the switch ignored", "vision_tx/ops/linear_autograd.py",
           "        onednn_training_enabled()\n        and onednn_linear_may_run(x)", "        onednn_linear_may_run(x)", (LINEAR_TRAINING,)),
    Mutant("oneDNN training: MKL said to keep up on any vendor", "vision_tx/ops/onednn.py",
           'return mkl and "GenuineIntel" in cpuinfo', "return mkl", (ONEDNN,)),
    Mutant("oneDNN training: the CPU's default inverted", "vision_tx/ops/onednn.py",
           "    return not mkl_products_keep_up()", "    return mkl_products_keep_up()", (ONEDNN,)),
    # Deformable attention module, encoder, decoder (DINO two-stage against transformers' DeformableDetr)
    Mutant("deformable attention: sigmoid for softmax", "vision_tx/heads/dino/deformable_attention.py",
           "weights = self.attention_weights(query).view(batch, queries, heads, levels * points).softmax(-1)",
           "weights = self.attention_weights(query).view(batch, queries, heads, levels * points).sigmoid()", (DINO_TX,)),
    Mutant("deformable attention: softmax over points of each level", "vision_tx/heads/dino/deformable_attention.py",
           "weights = self.attention_weights(query).view(batch, queries, heads, levels * points).softmax(-1)",
           "weights = self.attention_weights(query).view(batch, queries, heads, levels, points).softmax(-1)", (DINO_TX,)),
    Mutant("deformable attention: level and point order swapped", "vision_tx/heads/dino/deformable_attention.py",
           "offsets = self.sampling_offsets(query).view(batch, queries, heads, levels, points, 2)",
           "offsets = self.sampling_offsets(query).view(batch, queries, heads, points, levels, 2).transpose(3, 4)", (DINO_TX,)),
    Mutant("deformable attention: offsets normalised by (h, w)", "vision_tx/heads/dino/deformable_attention.py",
           "size = torch.tensor([[w, h] for h, w in shapes]", "size = torch.tensor([[h, w] for h, w in shapes]", (DINO_TX,)),
    Mutant("deformable attention: wrong sign of the offset around a box", "vision_tx/heads/dino/deformable_attention.py",
           "locations = reference[:, :, None, :, None, :2] + offsets * reference",
           "locations = reference[:, :, None, :, None, :2] - offsets * reference", (DINO_TX,)),
    Mutant("deformable attention: box offset scale 0.5 -> 1", "vision_tx/heads/dino/deformable_attention.py",
           "* (0.5 / points)", "* (1.0 / points)", (DINO_TX,)),
    Mutant("deformable attention: wrong sign of the offset around a point", "vision_tx/heads/dino/deformable_attention.py",
           "locations = reference[:, :, None, :, None, :] + offsets / size", "locations = reference[:, :, None, :, None, :] - offsets / size", (DINO_TX,)),
    Mutant("deformable attention: padding not masked", "vision_tx/heads/dino/deformable_attention.py",
           "value = value.masked_fill(padding_mask[..., None], 0.0)", "value = value", (DINO_TX,)),
    Mutant("deformable encoder: post-attention norm skipped", "vision_tx/heads/dino/transformer.py",
           "x = self.norm1(x + self.dropout(self.self_attn(x + position, reference, x, shapes, padding_mask)))",
           "x = x + self.dropout(self.self_attn(x + position, reference, x, shapes, padding_mask))", (DINO_TX,)),
    Mutant("deformable encoder: position not added to the query", "vision_tx/heads/dino/transformer.py",
           "self.self_attn(x + position, reference, x, shapes, padding_mask)", "self.self_attn(x, reference, x, shapes, padding_mask)", (DINO_TX,)),
    # With dropout in training the block runs the plain layers; without, the fused function.
    Mutant("deformable transformer: FFN ReLU removed (with dropout)", "vision_tx/heads/dino/transformer.py",
           "self.linear2(self.dropout(F.relu(self.linear1(x))))", "self.linear2(self.dropout(self.linear1(x)))", (DINO_TX, DINO_FFN)),
    Mutant("deformable encoder: reference points on pixel corners", "vision_tx/heads/dino/transformer.py",
           "torch.arange(height, dtype=valid_ratios.dtype, device=valid_ratios.device) + 0.5,",
           "torch.arange(height, dtype=valid_ratios.dtype, device=valid_ratios.device) + 0.0,", (DINO_TX,)),
    Mutant("deformable encoder: reference points not scaled by the valid ratios", "vision_tx/heads/dino/transformer.py",
           "return torch.cat(points, 1)[:, :, None] * valid_ratios[:, None]", "return torch.cat(points, 1)[:, :, None].expand(-1, -1, valid_ratios.shape[1], -1)", (DINO_TX,)),
    Mutant("deformable decoder: norm1 and norm2 swapped", "vision_tx/heads/dino/transformer.py",
           "queries = self.norm1(queries + self.dropout(attended))", "queries = self.norm2(queries + self.dropout(attended))", (DINO_TX,)),
    Mutant("deformable decoder: query position not in self-attention", "vision_tx/heads/dino/transformer.py",
           "q = k = queries + query_pos", "q = k = queries", (DINO_TX,)),
    Mutant("deformable decoder: reference boxes not detached", "vision_tx/heads/dino/transformer.py",
           "reference = refined.detach()", "reference = refined", (DINO_TX_GRAD,)),
    Mutant("deformable decoder: look forward twice ignored", "vision_tx/heads/dino/transformer.py",
           "start = refined if look_forward_twice else reference", "start = reference", (DINO_LFT,)),
    Mutant("deformable decoder: reference boxes not scaled by the valid ratios", "vision_tx/heads/dino/transformer.py",
           "level_reference = reference[:, :, None] * valid_ratios.repeat(1, 1, 2)[:, None]",
           "level_reference = reference[:, :, None].expand(-1, -1, valid_ratios.shape[1], -1)", (DINO_TX,)),
    Mutant("deformable decoder: DINO query position from the unscaled boxes", "vision_tx/heads/dino/transformer.py",
           "box_sine_embedding(level_reference[:, :, 0], self.dim // 2)", "box_sine_embedding(reference, self.dim // 2)", (DINO_MIXED,)),
    Mutant("box sine embedding: 2 pi scale dropped", "vision_tx/heads/dino/transformer.py",
           "return sine_embedding(boxes * (2 * math.pi), num_feats, temperature).flatten(-2)",
           "return sine_embedding(boxes, num_feats, temperature).flatten(-2)", (DINO_TX,)),
    Mutant("multiscale neck: GroupNorm skipped", "vision_tx/necks/multiscale.py",
           "levels = [projection(x) for projection, x in zip(self.input_proj, maps)]",
           "levels = [projection[0](x) for projection, x in zip(self.input_proj, maps)]", (DINO_TX,)),
    Mutant("multiscale neck: level embedding of level 0 everywhere", "vision_tx/necks/multiscale.py",
           "+ self.level_embed[level]", "+ self.level_embed[0]", (DINO_TX,)),
    Mutant("multiscale neck: the position offset ignored", "vision_tx/necks/multiscale.py",
           "SinePositionEncoding(dim // 2, temperature, offset=offset)", "SinePositionEncoding(dim // 2, temperature)", (DINO_TX,)),
    Mutant("deformable decoder: looks forward through the whole chain, not twice", "vision_tx/heads/dino/transformer.py",
           "refined = box if same else", "refined = box if True else", (DINO_LFT,)),
    Mutant("deformable decoder: final norm skipped", "vision_tx/heads/dino/transformer.py",
           "output = queries if self.norm is None else self.norm(queries)", "output = queries", (DINO_NORM,)),
    Mutant("deformable decoder: references refined from the normed output", "vision_tx/heads/dino/transformer.py",
           "refined = box if same else (delta + inverse_sigmoid(reference, self.eps)).sigmoid()",
           "refined = (output_delta + inverse_sigmoid(reference, self.eps)).sigmoid()", (DINO_NORM,)),
    Mutant("multiscale neck: valid ratios (w, h) swapped", "vision_tx/necks/multiscale.py",
           "ratios.append(torch.stack([valid[:, 0, :].sum(1) / mask.shape[2], valid[:, :, 0].sum(1) / mask.shape[1]], -1))",
           "ratios.append(torch.stack([valid[:, :, 0].sum(1) / mask.shape[1], valid[:, 0, :].sum(1) / mask.shape[2]], -1))", (DINO_TX,)),
    Mutant("multiscale neck: extra level from the projected map", "vision_tx/necks/multiscale.py",
           "source = maps[-1]", "source = levels[len(maps) - 1]", (DINO_TX,)),
    Mutant("dino postprocess: softmax for sigmoid", "vision_tx/heads/detr/postprocess.py",
           "probabilities = logits.sigmoid()", "probabilities = logits.softmax(-1)", (DINO_POSTPROCESS,)),
    Mutant("shared scores: each class's share alone (p / sum)", "vision_tx/heads/detr/postprocess.py",
           "return probabilities * probabilities / probabilities.sum(-1, keepdim=True)",
           "return probabilities / probabilities.sum(-1, keepdim=True)", (SHARED_SCORES, SHARED_TORN)),
    Mutant("shared scores: the share over the whole image's queries", "vision_tx/heads/detr/postprocess.py",
           "return probabilities * probabilities / probabilities.sum(-1, keepdim=True)",
           "return probabilities * probabilities / probabilities.sum((-2, -1), keepdim=True)", (SHARED_SCORES, SHARED_TORN)),
    Mutant("shared scores: the per-query pictures keep the plain scores", "vision_tx/heads/detr/postprocess.py",
           "scores, labels = sigmoid_scores(logits, share_scores).max(-1)", "scores, labels = logits.sigmoid().max(-1)", (SHARED_SCORES,)),
    Mutant("dino postprocess: query of a (query, class) pair by modulo", "vision_tx/heads/detr/postprocess.py",
           'queries = torch.div(index, num_classes, rounding_mode="floor")', "queries = index % logits.shape[1]", (DINO_POSTPROCESS,)),
    Mutant("dino postprocess: NMS across classes", "vision_tx/heads/detr/postprocess.py",
           'found["scores"].float(), found["labels"], nms_threshold)', 'found["scores"].float(), torch.zeros_like(found["labels"]), nms_threshold)', (DINO_NMS,)),
    Mutant("dino postprocess: NMS keeps the lower-scored box", "vision_tx/heads/detr/postprocess.py",
           'batched_nms(found["boxes"].float(), found["scores"].float()', 'batched_nms(found["boxes"].float(), -found["scores"].float()', (DINO_NMS,)),
    Mutant("dino: proposal norm skipped", "vision_tx/models/query_detector.py",
           "features = enc_output_norm(enc_output(features))", "features = enc_output(features)", (DINO_TX,)),
    Mutant("dino: anchor size doubled", "vision_tx/models/query_detector.py",
           "sizes = torch.full_like(centres, 0.05 * 2.0**level)", "sizes = torch.full_like(centres, 0.05 * 2.0 ** (level + 1))", (DINO_TX,)),
    Mutant("dino: anchor centres off by half a pixel", "vision_tx/models/query_detector.py",
           "centres = (torch.stack([x, y], -1).flatten(0, 1)[None] + 0.5) / valid_size[:, None]",
           "centres = (torch.stack([x, y], -1).flatten(0, 1)[None] + 1.0) / valid_size[:, None]", (DINO_TX,)),
    Mutant("dino: anchor validity threshold 0.01 -> 0.05", "vision_tx/models/query_detector.py",
           "valid = ((anchors > 0.01) & (anchors < 0.99))", "valid = ((anchors > 0.05) & (anchors < 0.99))", (DINO_TX,)),
    Mutant("dino: two-stage position and content halves swapped", "vision_tx/models/dino.py",
           "query_pos, queries = self.pos_trans_norm(", "queries, query_pos = self.pos_trans_norm(", (DINO_TX,)),
    Mutant("dino: proposal boxes not detached", "vision_tx/models/dino.py",
           "boxes = proposal_boxes.detach()", "boxes = proposal_boxes", (DINO_TX_GRAD,)),
    Mutant("dino: mixed selection ranks by class 0 only", "vision_tx/models/query_detector.py",
           'score = logits[..., 0] if class_agnostic else logits.max(-1).values',
           "score = logits[..., 0]", (DINO_MIXED,)),
    # DINO denoising and loss
    Mutant("denoising mask: matching queries see the denoising ones", "vision_tx/heads/dino/denoising.py",
           "return other_group | (~is_denoising[:, None] & is_denoising[None, :])",
           "return other_group | (is_denoising[:, None] & ~is_denoising[None, :])", (DINO_DN_MASK,)),
    Mutant("denoising mask: groups see each other", "vision_tx/heads/dino/denoising.py",
           "(group[:, None] != group[None, :])", "(group[:, None] == group[None, :])", (DINO_DN_MASK,)),
    Mutant("denoising: negatives' extra noise on the positives", "vision_tx/heads/dino/denoising.py",
           "magnitude[:, :, 1] += 1.0", "magnitude[:, :, 0] += 1.0", (DINO_DN_NOISE,)),
    Mutant("denoising: label noise ratio not halved", "vision_tx/heads/dino/denoising.py",
           "< self.label_noise_ratio * 0.5", "< self.label_noise_ratio", ("tests/models/test_dino.py::test_label_noise_replaces_about_half_the_ratio",)),
    Mutant("denoising: box noise of the whole size (not half)", "vision_tx/heads/dino/denoising.py",
           "half_size = boxes[..., 2:].repeat(1, 1, 1, 1, 2) / 2", "half_size = boxes[..., 2:].repeat(1, 1, 1, 1, 2)", (DINO_DN_NOISE,)),
    Mutant("denoising: boxes read as xywh", "vision_tx/heads/dino/denoising.py",
           'corners = box_convert(boxes, "cxcywh", "xyxy")', 'corners = box_convert(boxes, "xywh", "xyxy")', (DINO_DN_NOISE,)),
    Mutant("denoising: positives indexed without the negatives", "vision_tx/heads/dino/denoising.py",
           "group_start = torch.arange(self.num_groups)[:, None] * 2 * self.group_size",
           "group_start = torch.arange(self.num_groups)[:, None] * self.group_size", (DINO_DN_NOISE, DINO_DN_LOSS)),
    Mutant("denoising: padding slots keep a label embedding", "vision_tx/heads/dino/denoising.py",
           "content = self.label_embed(labels) * valid[..., None]", "content = self.label_embed(labels)", (DINO_DN_NOISE,)),
    Mutant("denoising: half the official groups (dn_number // 2K)", "vision_tx/heads/dino/denoising.py",
           "num_groups = max(1, self.num_queries // group_size)", "num_groups = max(1, self.num_queries // (2 * group_size))",
           (DN_GROUPS, DN_RT_DETR)),
    Mutant("denoising: noised boxes not clamped by the inverse sigmoid", "vision_tx/heads/dino/denoising.py",
           "noised = inverse_sigmoid(noised, self.eps).sigmoid()", "noised = noised", (DN_CLAMP, DN_RT_DETR)),
    Mutant("denoising: inverse-sigmoid bound 1e-5 (RT-DETR's, not DINO's)", "vision_tx/heads/dino/denoising.py",
           "        eps: float = 1e-3,", "        eps: float = 1e-5,", (DN_CLAMP, DINO_DEFAULTS)),
    Mutant("denoising mask: a group does not see the matching queries", "vision_tx/heads/dino/denoising.py",
           "other_group = is_denoising[:, None] & is_denoising[None, :] & (group[:, None] != group[None, :])",
           "other_group = is_denoising[:, None] & (group[:, None] != group[None, :])", (DN_MASK_BOTH, DN_RT_DETR)),
    Mutant("dino default: box noise scale 0.4 (the config file's; the official training command's is 1.0)", "vision_tx/models/dino.py",
           "box_noise_scale: float = 1.0,", "box_noise_scale: float = 0.4,", (DINO_DEFAULTS,)),
    Mutant("dino default: dn_number 200", "vision_tx/models/dino.py",
           "num_denoising: int = 100,", "num_denoising: int = 200,", (DINO_DEFAULTS,)),
    Mutant("dino default: 100 detections an image (Deformable DETR's; the official num_select 300)", "vision_tx/models/dino.py",
           "num_detections: int = 300,", "num_detections: int = 100,", (DINO_DEFAULTS,)),
    Mutant("dino default: share_scores on (vision_tx's own option, off by default)", "vision_tx/models/dino.py",
           "share_scores: bool = False,", "share_scores: bool = True,", (DINO_DEFAULTS,)),
    Mutant("dino default: matcher class cost 1 (the official 2)", "vision_tx/heads/dino/criterion.py",
           "HungarianMatcher(2.0, 5.0, 2.0,", "HungarianMatcher(1.0, 5.0, 2.0,", (DINO_DEFAULTS,)),
    Mutant("dino loss: GIoU weight 2 -> 1", "vision_tx/heads/dino/criterion.py",
           "weight_giou: float = 2.0,", "weight_giou: float = 1.0,", (DINO_DEFAULTS, DINO_ALL_LOSSES)),
    Mutant("dino loss: mixed selection's encoder proposals untrained", "vision_tx/heads/dino/criterion.py",
           "if encoder is not None and not class_agnostic:", "if encoder is not None and not class_agnostic and False:", (DINO_ALL_LOSSES,)),
    Mutant("dino loss: denoising trained on the last layer only", "vision_tx/heads/dino/criterion.py",
           'dn_logits, dn_boxes = denoising["pred_logits"], denoising["pred_boxes"]',
           'dn_logits, dn_boxes = denoising["pred_logits"][-1:], denoising["pred_boxes"][-1:]', (DINO_ALL_LOSSES,)),
    Mutant("dino loss: box L1 weight 5 -> 2", "vision_tx/heads/dino/criterion.py",
           "weight_bbox: float = 5.0", "weight_bbox: float = 2.0", (DINO_TX,)),
    Mutant("dino loss: focal alpha 0.25 -> 0.5", "vision_tx/heads/dino/criterion.py",
           "focal_alpha: float = 0.25", "focal_alpha: float = 0.5", (DINO_TX,)),
    Mutant("dino loss: denoising not normalised by the groups", "vision_tx/heads/dino/criterion.py",
           "num_boxes * queries.num_groups, dn_names,", "num_boxes, dn_names,", (DINO_DN_LOSS,)),
    Mutant("dino loss: class-agnostic proposals trained on the classes", "vision_tx/heads/dino/criterion.py",
           'agnostic = [{**t, "labels": torch.zeros_like(t["labels"])} for t in targets]', "agnostic = targets", (DINO_TX,)),
    Mutant("dino converter: decoder norm1 and norm2 read unswapped", "vision_tx/models/dino_official.py",
           r'(r"^transformer\.decoder\.layers\.(\d+)\.norm2\.", r"decoder.layers.\1.norm1."),',
           r'(r"^transformer\.decoder\.layers\.(\d+)\.norm2\.", r"decoder.layers.\1.norm2."),', (DINO_OFFICIAL,)),
    Mutant("dino converter: ref_point_head columns not reordered", "vision_tx/models/dino_official.py",
           "value = torch.cat([value[:, quarter : 2 * quarter], value[:, :quarter], value[:, 2 * quarter :]], 1)",
           "value = torch.cat([value[:, :quarter], value[:, quarter : 2 * quarter], value[:, 2 * quarter :]], 1)", (DINO_OFFICIAL,)),
    Mutant("dino converter: label embedding rows shifted", "vision_tx/models/dino_official.py",
           "value = value[:-1]", "value = value[1:]", (DINO_OFFICIAL,)),
    # Fine-tuning from official checkpoints of another number of classes
    Mutant("fine-tuning: class tensors of another count refused", "vision_tx/backbones/weights.py",
           "other_classes = other_class_keys(state, model, class_keys)", "other_classes = []", (FINETUNE_DETR, FINETUNE_CLASSIFIER)),
    Mutant("fine-tuning: DINO's label book cut to the new class count and loaded", "vision_tx/models/dino_official.py",
           "value = value[:-1]", "value = value[: model.num_classes]", (FINETUNE_DINO,)),
    Mutant("fine-tuning: DINO's label book of one class more read as the model's", "vision_tx/models/dino_official.py",
           "value = value[:-1]", "value = value[: model.num_classes] if len(value) == model.num_classes + 1 else value",
           (f"{FINETUNE_ONE_MORE}[dino]",)),
    Mutant("fine-tuning: RT-DETR's denoising labels cut to the new class count and loaded", "vision_tx/models/rtdetr_official.py",
           "value = value[:-1]", "value = value[: model.num_classes]", (FINETUNE_RTDETR,)),
    Mutant("fine-tuning: RT-DETR's denoising labels of one class more read as the model's", "vision_tx/models/rtdetr_official.py",
           "value = value[:-1]", "value = value[: model.num_classes] if len(value) == model.num_classes + 1 else value",
           (f"{FINETUNE_ONE_MORE}[rtdetr]",)),
    Mutant("fine-tuning: Mask2Former's class head not a class tensor", "vision_tx/models/mask2former.py",
           'class_keys = (r"^predictor\\.class_embed\\.",)', 'class_keys = (r"^predictor\\.mask_embed\\.",)', (FINETUNE_M2F,)),
    Mutant("fine-tuning: the detection task does not log what it left", "vision_tx/lightning/detection.py",
           'rank_zero_info(f"model weights: {report}")', 'rank_zero_info(f"model weights: {report.source}")', (f"{FINETUNE_TWO_STEPS}[rtdetr]",)),
    Mutant("fine-tuning: the segmentation task does not log what it left", "vision_tx/lightning/segmentation.py",
           'rank_zero_info(f"model weights: {report}")', 'rank_zero_info(f"model weights: {report.source}")',
           (f"{FINETUNE_TWO_STEPS}[mask2former]",)),
    Mutant("fine-tuning: tools/convert_weights.py refuses another class count", "vision_tx/models/convert.py",
           "class_keys = model.class_keys if convertible_model(arch) is not None else ()", "class_keys = ()",
           (f"{FINETUNE_OFFICIAL}::test_conversion_to_another_class_count_keeps_the_new_class_tensors",)),
    # Constructor defaults against the official configs (tests/models/test_official_defaults.py)
    Mutant("official defaults: RT-DETR's decoder feed-forward 2048 (DINO's; the official 1024)", "vision_tx/models/rtdetr.py",
           "        dim_feedforward: int = 1024,", "        dim_feedforward: int = 2048,", (OFFICIAL_DEFAULTS,)),
    Mutant("official defaults: RT-DETR 900 queries (DINO's; the official 300)", "vision_tx/models/rtdetr.py",
           "num_queries: int = 300,", "num_queries: int = 900,", (OFFICIAL_DEFAULTS,)),
    Mutant("official defaults: Mask2Former 6 decoder layers (the official 9)", "vision_tx/models/mask2former.py",
           "num_decoder_layers: int = 9,", "num_decoder_layers: int = 6,", (OFFICIAL_DEFAULTS,)),
    Mutant("official defaults: Mask2Former's encoder feed-forward 2048 (the decoder's; the official 1024)", "vision_tx/models/mask2former.py",
           "encoder_dim_feedforward: int = 1024,", "encoder_dim_feedforward: int = 2048,", (OFFICIAL_DEFAULTS,)),
    Mutant("official defaults: Mask2Former class weight 1 (DETR's; the official 2)", "vision_tx/heads/mask2former/criterion.py",
           "weight_ce: float = 2.0,", "weight_ce: float = 1.0,", (OFFICIAL_DEFAULTS,)),
    Mutant("official defaults: DETR dropout 0 (DINO's; the official 0.1)", "vision_tx/models/detr.py",
           "dropout: float = 0.1,", "dropout: float = 0.0,", (OFFICIAL_DEFAULTS,)),
    Mutant("official defaults: UperNet auxiliary loss weight 1 (the official 0.4)", "vision_tx/models/segmentor.py",
           "aux_loss_weight: float = 0.4,", "aux_loss_weight: float = 1.0,", (OFFICIAL_DEFAULTS,)),
    Mutant("fine-tuning: mmsegmentation's conv_seg not read as the classifier", "vision_tx/models/segmentor.py",
           '.replace(".conv_seg.", ".classifier.")', '.replace(".conv_seg.", ".conv_seg.")', (FINETUNE_UPERNET,)),
    Mutant("fine-tuning: a classifier's head not a class tensor", "vision_tx/lightning/classification.py",
           'CLASS_KEYS = (r"^head(_dist)?\\.",)', 'CLASS_KEYS = (r"^head_dist\\.",)', (FINETUNE_CLASSIFIER,)),
    # A checkpoint meeting data with labels it cannot predict
    Mutant("label range: a label equal to the class count accepted", "vision_tx/lightning/task.py",
           "if largest >= num_classes:", "if largest > num_classes:", (LABEL_RANGE + "::test_detection_names_the_annotation_file_and_the_category",
                                                                         LABEL_RANGE + "::test_classification_names_the_class_folder")),
    Mutant("label range: not checked before validation", "vision_tx/lightning/task.py",
           "    def on_validation_start(self) -> None:\n        self.check_labels_fit()",
           "    def on_validation_start(self) -> None:\n        pass", (LABEL_RANGE_EVAL,)),
    # D-FINE
    Mutant("dfine weighting function: the step's exponent over reg_max - 1", "vision_tx/heads/dfine/fdr.py",
           "step = (bound + 1) ** (2 / (reg_max - 2))", "step = (bound + 1) ** (2 / (reg_max - 1))", (DFINE_W,)),
    Mutant("dfine integral: the edges' bins read edge-minor", "vision_tx/heads/dfine/fdr.py",
           "probabilities = corners.unflatten(-1, (4, -1)).softmax(-1)",
           "probabilities = corners.unflatten(-1, (-1, 4)).transpose(-1, -2).softmax(-1)", (DFINE_TX,)),
    Mutant("dfine fgl targets: the share of the left bin for the right's", "vision_tx/heads/dfine/fdr.py",
           "share = to_left / (to_left + to_right)", "share = to_right / (to_left + to_right)", (DFINE_W,)),
    Mutant("dfine fgl: IoU weights paired with the wrong edges", "vision_tx/heads/dfine/criterion.py",
           "return (cross_entropy * iou.repeat_interleave(4)).sum()", "return (cross_entropy * iou.repeat(4)).sum()", (DFINE_LOSS,)),
    Mutant("dfine ddf: matched and other edges' counts swapped", "vision_tx/heads/dfine/criterion.py",
           "(mean_positive * positive + mean_negative * negative)", "(mean_positive * negative + mean_negative * positive)", (DFINE_LOSS,)),
    Mutant("dfine ddf: temperature squared dropped", "vision_tx/heads/dfine/criterion.py",
           "* weight.flatten().repeat_interleave(4) * self.temperature**2", "* weight.flatten().repeat_interleave(4)", (DFINE_LOSS,)),
    Mutant("dfine lqe: the max for the mean of the top bins", "vision_tx/heads/dfine/fdr.py",
           "features = torch.cat([top, top.mean(-1, keepdim=True)], -1)", "features = torch.cat([top, top.max(-1, keepdim=True).values], -1)", (DFINE_TX,)),
    Mutant("dfine fdr: the previous layer's edge logits not added", "vision_tx/heads/dfine/decoder.py",
           "corners = box_head(queries + previous_hidden) + previous_corners", "corners = box_head(queries + previous_hidden)", (DFINE_TX,)),
    Mutant("dfine gate: the gates swapped", "vision_tx/heads/dfine/fdr.py",
           "return self.norm(first * residual + second * x)", "return self.norm(second * residual + first * x)", (DFINE_TX,)),
    Mutant("dfine attention: a point scaled by another level's point count", "vision_tx/heads/dfine/decoder.py",
           "scale = (self.points_scale * self.offset_scale)", "scale = (self.points_scale.roll(1) * self.offset_scale)", (DFINE_TX,)),
    Mutant("dfine union matching: each query keeps its least frequent target", "vision_tx/heads/dfine/criterion.py",
           "order = torch.sort(counts, descending=True, stable=True).indices", "order = torch.sort(counts, descending=False, stable=True).indices",
           ("tests/models/test_dfine.py::test_union_of_the_layers_matches_is_the_official_go_indices",)),
    Mutant("dfine union matching: divided by the target count, not the union's", "vision_tx/heads/dfine/criterion.py",
           'num_boxes_in_batch([{"labels": q} for q, _ in union], device)', "num_boxes",
           ("tests/models/test_dfine.py::test_union_matching_trains_every_layers_boxes_on_the_union",)),
    Mutant("dfine gelan: the halves read in the other order", "vision_tx/heads/dfine/encoder.py",
           "first, second = self.conv1(x).chunk(2, 1)", "second, first = self.conv1(x).chunk(2, 1)", (DFINE_TX,)),
    Mutant("dfine encoder: lateral convs with SiLU", "vision_tx/heads/dfine/encoder.py",
           "return ConvNorm(dim, dim, 1, activation=False)", "return ConvNorm(dim, dim, 1)", (DFINE_TX,)),
    Mutant("dfine official: a GELAN block's last 3x3 conv read as its first", "vision_tx/models/dfine_official.py",
           'r"encoder.\\1_blocks.\\2.conv3."', 'r"encoder.\\1_blocks.\\2.conv2."', (DFINE_OFFICIAL,)),
    Mutant("dfine official: the enc output norm read as its projection", "vision_tx/models/dfine_official.py",
           '(r"^decoder\\.enc_output\\.norm\\.", "decoder.enc_output.1.")', '(r"^decoder\\.enc_output\\.norm\\.", "decoder.enc_output.0.")', (DFINE_OFFICIAL,)),
    # RT-DETR
    Mutant("rtdetr aifi: norm1 and norm2 swapped", "vision_tx/heads/rtdetr/aifi.py",
           "x = self.norm1(x + self.dropout(self.self_attn(", "x = self.norm2(x + self.dropout(self.self_attn(", (RT_TX,)),
    Mutant("rtdetr aifi: FFN GELU removed", "vision_tx/heads/rtdetr/aifi.py",
           'self.linear1 = Linear(dim, dim_feedforward, activation="gelu")', "self.linear1 = Linear(dim, dim_feedforward)", (RT_TX,)),
    Mutant("rtdetr aifi: position not added to the keys", "vision_tx/heads/rtdetr/aifi.py",
           "q = k = x + position", "q, k = x + position, x", (RT_TX,)),
    Mutant("rtdetr aifi: position embedding axes swapped", "vision_tx/heads/rtdetr/aifi.py",
           "torch.cat([out_y.sin(), out_y.cos(), out_x.sin(), out_x.cos()], 1)",
           "torch.cat([out_x.sin(), out_x.cos(), out_y.sin(), out_y.cos()], 1)", (RT_POSITION, RT_TX)),
    Mutant("rtdetr aifi: frequency scale over dim / 2", "vision_tx/heads/rtdetr/aifi.py",
           "/ (dim // 4))\n", "/ (dim // 2))\n", (RT_POSITION, RT_TX)),
    Mutant("rtdetr aifi: padding attended, valid tokens hidden", "vision_tx/heads/rtdetr/aifi.py",
           "else padding_mask.flatten(1)", "else ~padding_mask.flatten(1)", (RT_PADDING,)),
    Mutant("rtdetr repvgg: activation removed", "vision_tx/heads/rtdetr/conv.py",
           "return self.act(self.conv1(x) + self.conv2(x))", "return self.conv1(x) + self.conv2(x)", (RT_TX,)),
    Mutant("rtdetr conv-norm: ReLU for SiLU", "vision_tx/heads/rtdetr/conv.py",
           "self.act = nn.SiLU() if activation else nn.Identity()", "self.act = nn.ReLU() if activation else nn.Identity()", (RT_TX,)),
    Mutant("rtdetr csp: the second branch dropped", "vision_tx/heads/rtdetr/conv.py",
           "return self.conv3(self.bottlenecks(self.conv1(x)) + self.conv2(x))", "return self.conv3(self.bottlenecks(self.conv1(x)))", (RT_TX,)),
    Mutant("rtdetr hybrid encoder: input projection BatchNorm skipped", "vision_tx/heads/rtdetr/hybrid_encoder.py",
           "projected = [projection(x) for projection, x in zip(self.input_proj, maps)]",
           "projected = [projection[0](x) for projection, x in zip(self.input_proj, maps)]", (RT_TX,)),
    Mutant("rtdetr fpn: upper and lower maps concatenated in the other order", "vision_tx/heads/rtdetr/hybrid_encoder.py",
           'torch.cat([F.interpolate(upper, size=lower.shape[-2:], mode="nearest"), lower], 1)',
           'torch.cat([lower, F.interpolate(upper, size=lower.shape[-2:], mode="nearest")], 1)', (RT_TX,)),
    Mutant("rtdetr fpn: bilinear upsampling", "vision_tx/heads/rtdetr/hybrid_encoder.py",
           'size=lower.shape[-2:], mode="nearest")', 'size=lower.shape[-2:], mode="bilinear")', (RT_TX,)),
    Mutant("rtdetr fpn: the lateral conv's output not kept for the PAN", "vision_tx/heads/rtdetr/hybrid_encoder.py",
           "upper = fpn[0] = lateral(fpn[0])", "upper = lateral(fpn[0])", (RT_TX,)),
    Mutant("rtdetr pan: reads the projected maps, not the FPN's", "vision_tx/heads/rtdetr/hybrid_encoder.py",
           "downsample(outputs[-1]), fpn[index + 1]], 1)", "downsample(outputs[-1]), projected[index + 1]], 1)", (RT_TX,)),
    Mutant("rtdetr: decoder input BatchNorm skipped", "vision_tx/models/query_detector.py",
           "levels = [projection(x) for projection, x in zip(self.decoder_input_proj, maps)]",
           "levels = [projection[0](x) for projection, x in zip(self.decoder_input_proj, maps)]", (RT_TX,)),
    Mutant("rtdetr: memory levels in reverse order", "vision_tx/models/query_detector.py",
           "return flatten_levels(levels, pixel_mask, strides=", "return flatten_levels(levels[::-1], pixel_mask, strides=", (RT_TX,)),
    Mutant("rtdetr: proposal content not detached", "vision_tx/models/query_detector.py",
           "top[..., None].expand(-1, -1, features.shape[-1])).detach()", "top[..., None].expand(-1, -1, features.shape[-1]))", (RT_GRAD,)),
    Mutant("rtdetr: query position from the undetached boxes", "vision_tx/heads/dino/transformer.py",
           "query_pos = self.ref_point_head(reference)", "query_pos = self.ref_point_head(refined)", (RT_GRAD,)),
    Mutant("rtdetr: noised boxes stored through DINO's eps 1e-3", "vision_tx/models/rtdetr.py",
           "label_noise_ratio, box_noise_scale, 1e-5, RTDETRCriterion", "label_noise_ratio, box_noise_scale, 1e-3, RTDETRCriterion", (RT_DENOISING,)),
    Mutant("rtdetr: look forward twice ignored (the shared decode)", "vision_tx/models/query_detector.py",
           "query_pos, attn_mask, self.look_forward_twice and self.training,", "query_pos, attn_mask, False,", (RT_LFT, DINO_LFT)),
    Mutant("rtdetr box refinement: the last layer's boxes not detached", "vision_tx/models/rtdetr.py",
           "last = layer_boxes[-1].detach()", "last = layer_boxes[-1]", (RT_REFINEMENT,)),
    Mutant("rtdetr box refinement: the denoising queries refined too", "vision_tx/models/rtdetr.py",
           "num_denoising = 0 if denoising is None else denoising.content.shape[1]", "num_denoising = 0", (RT_REFINEMENT,)),
    Mutant("rtdetr box refinement: read from the coarsest level", "vision_tx/models/rtdetr.py",
           "height, width = levels.shapes[0]\n        finest = levels.tokens[:, : height * width]",
           "height, width = levels.shapes[-1]\n        finest = levels.tokens[:, -height * width :]", (RT_REFINEMENT,)),
    Mutant("multi-scale levels: exact ratios from the padded extent", "vision_tx/necks/multiscale.py",
           "ratios.append(torch.stack([image_size[:, 0] / extent[0], image_size[:, 1] / extent[1]], -1))",
           "ratios.append(torch.stack([image_size[:, 0] / pixel_mask.shape[2], image_size[:, 1] / pixel_mask.shape[1]], -1))",
           (LEVEL_PIXELS, RT_LEVEL_PIXELS)),
    Mutant("rtdetr memory: Deformable DETR's cell ratios", "vision_tx/models/query_detector.py",
           "return flatten_levels(levels, pixel_mask, strides=self.level_strides(len(levels)))",
           "return flatten_levels(levels, pixel_mask)", (RT_LEVEL_PIXELS,)),
    Mutant("dino: exact valid ratios ignored", "vision_tx/models/dino.py",
           "if self.exact_valid_ratios else None", "if False else None", (DINO_LEVEL_PIXELS,)),
    Mutant("dino: exact valid ratios by default", "vision_tx/models/dino.py",
           "exact_valid_ratios: bool = False,", "exact_valid_ratios: bool = True,", (DINO_DEFAULTS,)),
    Mutant("multiscale neck: the strides not passed on", "vision_tx/necks/multiscale.py",
           "return flatten_levels(levels, pixel_mask, position, strides)", "return flatten_levels(levels, pixel_mask, position)",
           (DINO_LEVEL_PIXELS,)),
    Mutant("rtdetr memory: an extra level at the last stride", "vision_tx/models/query_detector.py",
           "strides[-1] * 2 ** (i + 1) for i", "strides[-1] * 2**i for i", (RT_LEVEL_PIXELS,)),
    Mutant("proposal anchors: centred over the padded map", "vision_tx/models/query_detector.py",
           "valid_size = torch.stack([ratio[:, 0] * width, ratio[:, 1] * height], -1)",
           "valid_size = torch.stack([ratio[:, 0] * 0 + width, ratio[:, 1] * 0 + height], -1)", (RT_LEVEL_PIXELS,)),
    Mutant("box refinement: the grid not widened", "vision_tx/heads/rtdetr/box_refinement.py",
           "offsets * boxes[..., None, 2:] * enlarge", "offsets * boxes[..., None, 2:]", (BOX_REFINEMENT,)),
    Mutant("box refinement: the padding ignored", "vision_tx/heads/rtdetr/box_refinement.py",
           "self.enlarge) * valid_ratio[:, None, None]", "self.enlarge)", (BOX_REFINEMENT,)),
    Mutant("box refinement: the grid column by column", "vision_tx/heads/rtdetr/box_refinement.py",
           'torch.meshgrid(steps, steps, indexing="ij")', 'torch.meshgrid(steps, steps, indexing="xy")', (BOX_REFINEMENT,)),
    Mutant("box refinement: the edges shifted by shares of the wrong side (x by the height)", "vision_tx/heads/rtdetr/box_refinement.py",
           "shifts * boxes[..., 2:].repeat(1, 1, 2)", "shifts * boxes[..., 2:].flip(-1).repeat(1, 1, 2)", (BOX_REFINEMENT,)),
    Mutant("box refinement: a bin's samples taken across the bins", "vision_tx/heads/rtdetr/box_refinement.py",
           "samples.unflatten(-1, (size, per_side, size, per_side)).mean((-3, -1))",
           "samples.unflatten(-1, (per_side, size, per_side, size)).mean((-4, -2))", (BOX_REFINEMENT,)),
    Mutant("box refinement: shifts not bounded", "vision_tx/heads/rtdetr/box_refinement.py",
           "self.edges(self.sample(self.reduce(feature_map), boxes, valid_ratio)).tanh()",
           "self.edges(self.sample(self.reduce(feature_map), boxes, valid_ratio))", (BOX_REFINEMENT,)),
    Mutant("rtdetr loss: varifocal weight from softmax", "vision_tx/heads/rtdetr/criterion.py",
           "probability = logits.detach().sigmoid()", "probability = logits.detach().softmax(-1)", (RT_TRAIN,)),
    Mutant("rtdetr loss: varifocal target 1, not the IoU", "vision_tx/heads/rtdetr/criterion.py",
           "score[positives] = iou.to(logits.dtype)\n", "score[positives] = 1.0\n", (RT_TRAIN,)),
    Mutant("rtdetr loss: IoU target not detached", "vision_tx/heads/rtdetr/criterion.py",
           "iou = paired_box_iou(matched.detach(), target_boxes)", "iou = paired_box_iou(matched, target_boxes)", (RT_GRAD,)),
    Mutant("rtdetr loss: varifocal alpha 0.75 -> 0.25", "vision_tx/heads/rtdetr/criterion.py",
           "vfl_alpha: float = 0.75", "vfl_alpha: float = 0.25", (RT_TRAIN,)),
    Mutant("rtdetr loss: GIoU weight 2 -> 1", "vision_tx/heads/rtdetr/criterion.py",
           "weight_giou: float = 2.0", "weight_giou: float = 1.0", (RT_TRAIN,)),
    Mutant("rtdetr loss: IoU normalised by union plus intersection", "vision_tx/heads/rtdetr/criterion.py",
           "return inter / union", "return inter / (union + inter)", (RT_TRAIN,)),
    Mutant("rtdetr converter: FFN norm3 read as norm2", "vision_tx/models/rtdetr_official.py",
           r'(r"^decoder\.decoder\.layers\.(\d+)\.norm3\.", r"decoder.layers.\1.ffn.norm."),',
           r'(r"^decoder\.decoder\.layers\.(\d+)\.norm3\.", r"decoder.layers.\1.norm2."),', (RT_OFFICIAL,)),
    Mutant("rtdetr converter: proposal heads as the first layer's", "vision_tx/models/rtdetr_official.py",
           "_embed.{num_layers}.{key[match.end():]}", "_embed.0.{key[match.end():]}", (RT_OFFICIAL,)),
    Mutant("rtdetr converter: denoising rows shifted", "vision_tx/models/rtdetr_official.py",
           "value = value[:-1]", "value = value[1:]", (RT_OFFICIAL,)),
    # The detector protocol (docs/CONVENTIONS.md, "Detectors"), on RT-DETR, the detector written beside it
    Mutant("detector protocol: rtdetr matcher_kwargs ignored", "vision_tx/models/query_detector.py",
           "matcher = HungarianMatcher(**matcher_kwargs) if matcher_kwargs else None", "matcher = None", (PROTOCOL_KWARGS,)),
    Mutant("detector protocol: rtdetr criterion_kwargs ignored", "vision_tx/models/query_detector.py",
           "criterion_class(self.num_classes, matcher, **(criterion_kwargs or {}))", "criterion_class(self.num_classes, matcher)", (PROTOCOL_KWARGS,)),
    Mutant("detector protocol: DINO's and RT-DETR's loss on the pipeline's absolute boxes", "vision_tx/models/query_detector.py",
           "return self.criterion(outputs, normalize_targets(targets))", "return self.criterion(outputs, targets)", (PROTOCOL_TARGETS,)),
    Mutant("detector protocol: rtdetr denoising on the pipeline's absolute boxes", "vision_tx/models/query_detector.py",
           "targets = normalize_targets(targets) if self.training and targets is not None else None",
           "targets = targets if self.training else None", (PROTOCOL_TARGETS,)),
    Mutant("detector protocol: DINO's and RT-DETR's per-query detections ranked by score", "vision_tx/models/query_detector.py",
           "return postprocess_sigmoid_per_query(outputs, image_sizes, self.share_scores)",
           "return postprocess_sigmoid_detections(outputs, image_sizes, self.num_detections, self.nms_threshold)", (PROTOCOL_OUTPUTS,)),
    Mutant("detector protocol: share_scores not passed to the detections", "vision_tx/models/query_detector.py",
           "image_sizes, self.num_detections, self.nms_threshold, self.share_scores)",
           "image_sizes, self.num_detections, self.nms_threshold)", (PROTOCOL_SHARE,)),
    # Named sizes (vision_tx/models/__init__.py: named_sizes) and the tables keyed by a detector's class
    Mutant("named sizes: a size's settings dropped (rtdetr_toy builds RT-DETR-R50)", "vision_tx/models/__init__.py",
           "table[name] = functools.partial(cls, **config)", "table[name] = functools.partial(cls)",
           ("tests/models/test_detectors.py::test_named_sizes_build_their_size_and_build_time_kwargs_win",)),
    Mutant("named sizes: the panoptic task names every detector as one that segments", "vision_tx/lightning/panoptic.py",
           'known = ", ".join(name for name, build in DETECTORS.items() if build.func in PANOPTIC_WRAPPERS)', 'known = ", ".join(DETECTORS)',
           ("tests/lightning/test_panoptic.py::test_detectors_by_class_whatever_their_size",)),
    Mutant("converter: DETR panoptic built with COCO detection's 91 classes (the official 250)", "vision_tx/models/convert.py",
           "DETR.for_conversion(backbone, num_classes or 250)", "DETR.for_conversion(backbone, num_classes)",
           (DETR_PANOPTIC,)),
    Mutant("structure: DETR panoptic imports DETR's file beside it", "vision_tx/models/detr_panoptic.py",
           "from vision_tx.heads.detr.postprocess import postprocess_panoptic\n",
           "from vision_tx.heads.detr.postprocess import postprocess_panoptic\nfrom vision_tx.models.detr import DETR\n",
           ("tests/test_imports.py::test_model_files_import_no_sibling_but_the_shared_room",)),
    # ViT / DeiT
    Mutant("vit: norm1 and norm2 swapped", "vision_tx/backbones/vit.py",
           "drop_path(self.attn(self.norm1(t))", "drop_path(self.attn(self.norm2(t))", (VIT,)),
    Mutant("vit: final norm dropped", "vision_tx/backbones/vit.py", "return self.norm(x), grid", "return x, grid", (VIT,)),
    Mutant("vit: query and key swapped", "vision_tx/backbones/vit.py",
           "q, k, v = self._qkv(x)\n        return self.proj(", "k, q, v = self._qkv(x)\n        return self.proj(", (VIT,)),
    Mutant("vit: attention-map scale dropped", "vision_tx/backbones/vit.py",
           "return (q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5).softmax(-1)", "return (q @ k.transpose(-2, -1)).softmax(-1)", (VIT_WEIGHTS,)),
    Mutant("vit: position embedding not added", "vision_tx/backbones/vit.py",
           "return tokens + resize_pos_embed(", "return tokens + 0 * resize_pos_embed(", (VIT,)),
    Mutant("vit: resized position grid transposed", "vision_tx/backbones/vit.py",
           "patches = F.interpolate(patches, size=new_grid,", "patches = F.interpolate(patches, size=new_grid[::-1],", (VIT_RESIZE,)),
    Mutant("vit: position resize without antialiasing", "vision_tx/backbones/vit.py",
           'mode="bicubic", antialias=True', 'mode="bicubic", antialias=False', (VIT_RESIZE,)),
    Mutant("deit: eval logits from the class head only", "vision_tx/backbones/vit.py",
           "(logits + distilled) / 2", "logits", (VIT,)),
    Mutant("deit: distillation head reads the class token", "vision_tx/backbones/vit.py",
           "distilled = self.head_dist(tokens[:, 1])", "distilled = self.head_dist(tokens[:, 0])", (VIT,)),
    # ViTDet simple feature pyramid
    Mutant("vitdet pyramid: GELU between the transposed convolutions removed", "vision_tx/backbones/pyramid.py",
           "nn.GELU(), nn.ConvTranspose2d(dim // 2, dim // 4, 2, stride=2)]", "nn.ConvTranspose2d(dim // 2, dim // 4, 2, stride=2)]", (PYRAMID,)),
    Mutant("vitdet pyramid: last norm dropped", "vision_tx/backbones/pyramid.py",
           "nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=False), LayerNorm2d(out_channels, eps=1e-6),",
           "nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=False), nn.Identity(),", (PYRAMID,)),
    Mutant("vitdet pyramid: channel norm over the wrong axis", "vision_tx/backbones/pyramid.py",
           "return F.layer_norm(x.permute(0, 2, 3, 1), self.normalized_shape", "return F.layer_norm(x.permute(0, 3, 2, 1), self.normalized_shape", (PYRAMID,)),
    Mutant("vitdet pyramid: average pooling for max", "vision_tx/backbones/pyramid.py",
           "layers, channels = [nn.MaxPool2d(2, ceil_mode=True)], dim", "layers, channels = [nn.AvgPool2d(2, ceil_mode=True)], dim", (PYRAMID,)),
    # ConvNeXt
    Mutant("convnext: downsample norm dropped", "vision_tx/backbones/convnext.py",
           "x = self.norm(x).permute(0, 3, 1, 2)", "x = x.permute(0, 3, 1, 2)", (CONVNEXT,)),
    Mutant("convnext: layer scale not applied", "vision_tx/backbones/convnext.py",
           "return torch.addcmul(x, branch, self.gamma)", "return x + branch", (CONVNEXT,)),
    Mutant("convnext: block norm skipped", "vision_tx/backbones/convnext.py",
           "branch = self.mlp(self.norm(self.conv_dw(x.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)))",
           "branch = self.mlp(self.conv_dw(x.permute(0, 3, 1, 2)).permute(0, 2, 3, 1))", (CONVNEXT,)),
    Mutant("convnext: dense output norm not applied", "vision_tx/backbones/layers.py",
           'outputs[f"res{index + 2}"] = stage.out_norm(x).permute(0, 3, 1, 2).contiguous()',
           'outputs[f"res{index + 2}"] = x.permute(0, 3, 1, 2).contiguous()', (CONVNEXT_DENSE,)),
    Mutant("convnext small-data: average pooling for max", "vision_tx/backbones/convnext.py",
           "x = F.max_pool2d(x.permute(0, 3, 1, 2), kernel_size=2, ceil_mode=True)",
           "x = F.avg_pool2d(x.permute(0, 3, 1, 2), kernel_size=2, ceil_mode=True)", (CONVNEXT_SMALL_DATA,)),
    Mutant("convnext small-data: batch statistics at evaluation", "vision_tx/backbones/convnext.py",
           "return self.bn(x.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)",
           "return F.batch_norm(x.permute(0, 3, 1, 2), None, None, self.bn.weight, self.bn.bias, True, 0.0, self.bn.eps).permute(0, 2, 3, 1)",
           (CONVNEXT_SMALL_DATA,)),
    Mutant("convnext small-data: head keeps the LayerNorm", "vision_tx/backbones/convnext.py",
           'norm = nn.BatchNorm1d(dim) if kwargs.get("norm") == "batchnorm" else nn.LayerNorm(dim, eps=1e-6)',
           "norm = nn.LayerNorm(dim, eps=1e-6)", (CONVNEXT_SMALL_DATA,)),
    Mutant("convnext small-data: norm after the 1x1 convolution", "vision_tx/backbones/convnext.py",
           "return self.conv(self.norm(x).permute(0, 3, 1, 2).contiguous(memory_format=torch.channels_last)).permute(0, 2, 3, 1)",
           "return self.norm(self.conv(x.permute(0, 3, 1, 2).contiguous(memory_format=torch.channels_last)).permute(0, 2, 3, 1))", (CONVNEXT_SMALL_DATA,)),
    Mutant("convnext small-data: dense output norm not applied", "vision_tx/backbones/layers.py",
           'outputs[f"res{index + 2}"] = stage.out_norm(x).permute(0, 3, 1, 2).contiguous()',
           'outputs[f"res{index + 2}"] = x.permute(0, 3, 1, 2).contiguous()', (CONVNEXT_SMALL_DATA_DENSE,)),
    Mutant("convnext small-data: the BatchNorm is a BatchNorm2d subclass (sync conversion drops the permutation)",
           "vision_tx/backbones/convnext.py",
           "class ChannelsLastBatchNorm(nn.Module):",
           "class ChannelsLastBatchNorm(nn.BatchNorm2d):\n"
           "    bn = property(lambda self: self)\n"
           "    forward = lambda self, x: nn.BatchNorm2d.forward(self, x.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)\n\n\n"
           "class _Unused(nn.Module):", (CONVNEXT_SYNC_BN,)),
    Mutant("convnext small-data: BatchNorm momentum 0.01 (torch's 0.1)", "vision_tx/backbones/convnext.py",
           "self.bn = nn.BatchNorm2d(dim)", "self.bn = nn.BatchNorm2d(dim, momentum=0.01)", (CONVNEXT_RUNNING_STATISTICS,)),
    Mutant("convnext small-data: running statistics a cumulative average", "vision_tx/backbones/convnext.py",
           "self.bn = nn.BatchNorm2d(dim)", "self.bn = nn.BatchNorm2d(dim, momentum=None)", (CONVNEXT_RUNNING_STATISTICS,)),
    Mutant("convnext small-data: head BatchNorm momentum 0.2", "vision_tx/backbones/convnext.py",
           'norm = nn.BatchNorm1d(dim) if kwargs.get("norm")', 'norm = nn.BatchNorm1d(dim, momentum=0.2) if kwargs.get("norm")',
           (CONVNEXT_RUNNING_STATISTICS,)),
    Mutant("convnext small-data: BatchNorm by hand, running variance biased", "vision_tx/backbones/convnext.py",
           "        return self.bn(x.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)",
           "        if self.training:\n"
           "            flat = x.detach().flatten(0, 2)\n"
           "            self.bn.running_mean.mul_(0.9).add_(0.1 * flat.mean(0))\n"
           "            self.bn.running_var.mul_(0.9).add_(0.1 * flat.var(0, correction=0))\n"
           "            self.bn.num_batches_tracked.add_(1)\n"
           "            return F.batch_norm(x.permute(0, 3, 1, 2), None, None, self.bn.weight, self.bn.bias, True, 0.0, self.bn.eps).permute(0, 2, 3, 1)\n"
           "        return self.bn(x.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)", (CONVNEXT_RUNNING_STATISTICS,)),
    # MLP-Mixer
    Mutant("mixer: token mixing reads norm2", "vision_tx/backbones/mixer.py",
           "tokens = self.mlp_tokens(self.norm1(x).transpose(1, 2)).transpose(1, 2)",
           "tokens = self.mlp_tokens(self.norm2(x).transpose(1, 2)).transpose(1, 2)", (MIXER,)),
    Mutant("mixer: final norm dropped", "vision_tx/backbones/mixer.py",
           "return self.norm(self.blocks(self.stem(images).flatten(1, 2)))", "return self.blocks(self.stem(images).flatten(1, 2))", (MIXER,)),
    Mutant("mixer: max pooling for mean", "vision_tx/backbones/mixer.py",
           "return self.head(self.forward_features(images).mean(1))", "return self.head(self.forward_features(images).amax(1))", (MIXER,)),
    # SAM
    Mutant("sam: descends instead of ascending", "vision_tx/optim/sam.py", "p.add_(e)", "p.sub_(e)", (SAM,)),
    Mutant("sam: adaptive norm without |w|", "vision_tx/optim/sam.py",
           "scaled = [p.grad * p.abs() if self.adaptive else p.grad for p in params]", "scaled = [p.grad for p in params]", (SAM,)),
    Mutant("sam: adaptive move by |w| not |w|^2", "vision_tx/optim/sam.py",
           "e = (g * p.abs() if self.adaptive else g) * factor.to(g.dtype)", "e = g * factor.to(g.dtype)", (SAM,)),
    Mutant("sam: rho over the squared norm", "vision_tx/optim/sam.py",
           "factor = self.rho / norm.clamp_min(1e-12)", "factor = self.rho / norm.clamp_min(1e-12) ** 2", (SAM,)),
    Mutant("sam: weights not restored before the base step", "vision_tx/optim/sam.py",
           "            p.sub_(e)\n", "            pass\n", (SAM,)),
    Mutant("sam under ddp: learning rate from the batch of one process", "vision_tx/lightning/classification.py",
           "global_batch = datamodule.hparams.batch_size * self.trainer.world_size * self.trainer.accumulate_grad_batches",
           "global_batch = datamodule.hparams.batch_size * self.trainer.accumulate_grad_batches", (SAM_DDP,)),
    # DeiT's hard distillation
    Mutant("distillation: teacher term on the class head", "vision_tx/lightning/classification.py",
           "F.cross_entropy(logits if distillation is None else distillation, teacher_labels)",
           "F.cross_entropy(logits, teacher_labels)", (DISTILLATION,)),
    Mutant("distillation: the labels for the teacher's argmax", "vision_tx/lightning/classification.py",
           "teacher_labels = teacher(images).argmax(1)", "teacher_labels = labels", (DISTILLATION,)),
    Mutant("distillation: label smoothing on the teacher's labels", "vision_tx/lightning/classification.py",
           "distillation, teacher_labels)", "distillation, teacher_labels, label_smoothing=hp.label_smoothing)", (DISTILLATION,)),
    Mutant("distillation: teacher left in training mode", "vision_tx/lightning/classification.py",
           "return teacher.eval().requires_grad_(False)", "return teacher.requires_grad_(False)", (DISTILLATION, TORCHVISION_TEACHER)),
    # Attention maps
    Mutant("attention rollout: layers multiplied in the wrong order", "vision_tx/attention.py",
           "rollout = mixed if rollout is None else mixed @ rollout", "rollout = mixed if rollout is None else rollout @ mixed", (ROLLOUT,)),
    Mutant("attention rollout: first head only", "vision_tx/attention.py",
           "mixed = layer.to(torch.promote_types(layer.dtype, torch.float32)).mean(1)",
           "mixed = layer.to(torch.promote_types(layer.dtype, torch.float32))[:, 0]", (ROLLOUT,)),
    Mutant("attention rollout: residual weight ignored", "vision_tx/attention.py",
           "mixed = residual * eye + (1 - residual) * mixed", "mixed = eye + mixed", (ROLLOUT,)),
    Mutant("attention weights: scale 1/d", "vision_tx/attention.py",
           "scale = q.shape[-1] ** -0.5 if scale is None else scale", "scale = q.shape[-1] ** -1.0 if scale is None else scale", (ATTN_WEIGHTS,)),
    Mutant("attention weights: bool mask inverted", "vision_tx/attention.py",
           "scores.masked_fill(~attn_mask, float(\"-inf\"))", "scores.masked_fill(attn_mask, float(\"-inf\"))", (ATTN_WEIGHTS,)),
    Mutant("attention weights: causal mask hides the diagonal", "vision_tx/attention.py",
           "torch.ones_like(scores, dtype=torch.bool).triu(1)", "torch.ones_like(scores, dtype=torch.bool).triu(0)", (ATTN_WEIGHTS,)),
    Mutant("attention maps: last layer taken from the first", "vision_tx/attention.py",
           "last = layers[-1][:, :, 0, prefix:]", "last = layers[0][:, :, 0, prefix:]", (ROLLOUT,)),
    Mutant("detr attention map: first head only", "vision_tx/models/detr.py",
           'weights = records["cross"][-1].mean(1)', 'weights = records["cross"][-1][:, 0]', (DETR_ATTN,)),
    Mutant("splat: pixel centres not at half cells", "vision_tx/attention.py",
           "x = locations[..., 0] * width - 0.5", "x = locations[..., 0] * width", (SPLAT, DINO_ATTN)),
    Mutant("splat: y weight from the x corner", "vision_tx/attention.py",
           "(1 - (y - cy).abs()) * weights", "(1 - (y - cx).abs()) * weights", (SPLAT, DINO_ATTN)),
    Mutant("splat: points outside the grid clamped onto its border", "vision_tx/attention.py",
           "grid.scatter_add_(1, index, share * inside)", "grid.scatter_add_(1, index, share)", (SPLAT,)),
    Mutant("dino attention map: heads summed, not averaged", "vision_tx/models/query_detector.py",
           "maps.view(batch, queries, *shapes[0]) / heads}", "maps.view(batch, queries, *shapes[0])}", (DINO_ATTN,)),
    Mutant("dino attention map: first decoder layer", "vision_tx/models/query_detector.py",
           "cross = decoder.layers[-1].cross_attn", "cross = decoder.layers[0].cross_attn", (DINO_ATTN,)),
    # Per-category tables (classwise)
    Mutant("classwise: AP75 read at IoU 0.70", "vision_tx/metrics/classwise.py", '("AP75", 5, 0)', '("AP75", 4, 0)', (CLASSWISE,)),
    Mutant("classwise: -1 (no ground truth) averaged in", "vision_tx/metrics/classwise.py",
           "values = values[values > -1]", "values = values[values >= -1]", (CLASSWISE,)),
    Mutant("classwise: precision at maxDets 1", "vision_tx/metrics/classwise.py",
           "values = precision[:, :, k, area, -1] if iou is None else precision[iou, :, k, area, -1]",
           "values = precision[:, :, k, area, 0] if iou is None else precision[iou, :, k, area, 0]", (CLASSWISE,)),
    Mutant("classwise: the best categories listed as the worst", "vision_tx/metrics/classwise.py",
           "return sorted(scored, key=lambda row: row[key])[:count]", "return sorted(scored, key=lambda row: -row[key])[:count]", (CLASSWISE,)),
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
    # Mosaic augmentation
    Mutant("transforms: crop_probability read as the share left uncropped", "vision_tx/data/transforms.py",
           "p=[1.0 - crop_probability, crop_probability]", "p=[crop_probability, 1.0 - crop_probability]", (CROP_PROBABILITY,)),
    Mutant("transforms: the affine's uncovered area black", "vision_tx/data/transforms.py",
           'fill={tv_tensors.Image: FILL, "others": 0}', "fill=0", (AFFINE,)),
    Mutant("transforms: the affine never applied", "vision_tx/data/transforms.py",
           "p=affine_probability)", "p=0.0)", (AFFINE,)),
    Mutant("transforms: the channel permutation never applied", "vision_tx/data/transforms.py",
           "p=channel_permutation_probability)", "p=0.0)", (CHANNEL_PERMUTATION,)),
    Mutant("transforms: the channel permutation before the flip and resize (their draws change)", "vision_tx/data/transforms.py",
           "                v2.RandomHorizontalFlip(),\n", "                self.channel_permutation,\n                v2.RandomHorizontalFlip(),\n",
           (CHANNEL_PERMUTATION,)),
    Mutant("transforms: the switched-off channel permutation applied anyway", "vision_tx/data/transforms.py",
           "self.channel_permutation = SwitchableRandomApply([v2.RandomChannelPermutation()], p=channel_permutation_probability)",
           "self.channel_permutation = v2.RandomChannelPermutation()", (CHANNEL_PERMUTATION,)),
    Mutant("transforms: the vertical flip never applied", "vision_tx/data/transforms.py",
           "p=vertical_flip_probability)", "p=0.0)", (VERTICAL_FLIP,)),
    Mutant("transforms: the vertical flip mirrors left to right", "vision_tx/data/transforms.py",
           "[v2.RandomVerticalFlip(p=1.0)]", "[v2.RandomHorizontalFlip(p=1.0)]", (VERTICAL_FLIP,)),
    Mutant("transforms: the switched-off vertical flip applied anyway", "vision_tx/data/transforms.py",
           "self.vertical_flip = SwitchableRandomApply([v2.RandomVerticalFlip(p=1.0)], p=vertical_flip_probability)",
           "self.vertical_flip = v2.RandomVerticalFlip(p=vertical_flip_probability)", (VERTICAL_FLIP,)),
    Mutant("long-run augmentation: the vertical flip switched through the channel permutation", "vision_tx/lightning/augmentation.py",
           '"vertical_flip": ("vertical flip", ("train_transform", "vertical_flip")',
           '"vertical_flip": ("vertical flip", ("train_transform", "channel_permutation")', (LONG_RUN_AUGMENTATION,)),
    Mutant("transforms: the quarter turn never applied", "vision_tx/data/transforms.py",
           "p=quarter_turn_probability)", "p=0.0)", (QUARTER_TURN,)),
    Mutant("transforms: the quarter turn clockwise", "vision_tx/data/transforms.py",
           "v2.RandomRotation(degrees=(90, 90), expand=True)", "v2.RandomRotation(degrees=(-90, -90), expand=True)", (QUARTER_TURN,)),
    Mutant("transforms: the quarter turn on a canvas of the same size", "vision_tx/data/transforms.py",
           "v2.RandomRotation(degrees=(90, 90), expand=True)", "v2.RandomRotation(degrees=(90, 90), expand=False)", (QUARTER_TURN,)),
    Mutant("transforms: the switched-off quarter turn applied anyway", "vision_tx/data/transforms.py",
           "self.quarter_turn = SwitchableRandomApply([quarter_turn], p=quarter_turn_probability)",
           "self.quarter_turn = v2.RandomApply([quarter_turn], p=quarter_turn_probability)", (QUARTER_TURN,)),
    Mutant("long-run augmentation: the quarter turn switched through the vertical flip", "vision_tx/lightning/augmentation.py",
           '"quarter_turn": ("quarter turn", ("train_transform", "quarter_turn")',
           '"quarter_turn": ("quarter turn", ("train_transform", "vertical_flip")', (LONG_RUN_AUGMENTATION,)),
    Mutant("mosaic: right-hand quadrants placed left of the centre", "vision_tx/data/mosaic.py",
           "left = centre_x - new_w if quadrant in (0, 2) else centre_x", "left = centre_x - new_w if quadrant in (0, 1) else centre_x", (MOSAIC,)),
    Mutant("mosaic: boxes not shifted with their image", "vision_tx/data/mosaic.py",
           "boxes.append(scaled + torch.tensor([left, top, left, top], dtype=torch.float32))",
           "boxes.append(scaled + torch.tensor([top, left, top, left], dtype=torch.float32))", (MOSAIC,)),
    Mutant("mosaic: the kept window off by its offset", "vision_tx/data/mosaic.py",
           "clipped = (boxes_in_canvas - offset).clamp(0, size)", "clipped = boxes_in_canvas.clamp(0, size)", (MOSAIC,)),
    Mutant("mosaic: boxes cut below the visible fraction kept", "vision_tx/data/mosaic.py",
           "keep = (sides >= 2).all(1) & (sides.prod(1) >= self.min_visible * full_area)", "keep = (sides >= 2).all(1)", (MOSAIC,)),
    Mutant("held-out shapes: the plain background shaded across the image", "scripts/make_shapes_dataset.py",
           "return rng.uniform(0, 255, size=3) + rng.normal(",
           "return rng.uniform(0, 255, size=3) * np.linspace(0.5, 1, width)[None, :, None] + rng.normal(", (SHAPES,)),
    # Mask2Former (against transformers' Mask2FormerForUniversalSegmentation and image processor)
    Mutant("mask2former pixel decoder: levels highest resolution first", "vision_tx/heads/mask2former/pixel_decoder.py",
           "coarse = list(maps[-self.num_levels:])[::-1]", "coarse = list(maps[-self.num_levels:])", (M2F,)),
    Mutant("mask2former pixel decoder: FPN upsampling nearest", "vision_tx/heads/mask2former/pixel_decoder.py",
           "F.interpolate(finer, size=x.shape[-2:], mode=\"bilinear\", align_corners=False)",
           "F.interpolate(finer, size=x.shape[-2:], mode=\"nearest\")", (M2F,)),
    Mutant("mask2former pixel decoder: FPN lateral skipped", "vision_tx/heads/mask2former/pixel_decoder.py",
           "            x = lateral(x)\n", "            x = lateral(x) * 0\n", (M2F,)),
    Mutant("mask2former pixel decoder: mask features from the coarsest level", "vision_tx/heads/mask2former/pixel_decoder.py",
           "        finer = outputs[-1]\n", "        finer = outputs[0]\n", (M2F,)),
    Mutant("mask2former decoder: masked attention off", "vision_tx/heads/mask2former/decoder.py",
           "queries = layer(queries, query_pos, memory[level], memory_pos[level], attn_mask)",
           "queries = layer(queries, query_pos, memory[level], memory_pos[level], torch.zeros_like(attn_mask))", (M2F, M2F_MASKED)),
    Mutant("mask2former decoder: attention mask inverted", "vision_tx/heads/mask2former/decoder.py",
           "mode=\"bilinear\", align_corners=False).flatten(2) < 0", "mode=\"bilinear\", align_corners=False).flatten(2) > 0", (M2F, M2F_MASKED)),
    Mutant("mask2former decoder: an empty foreground blocks everything", "vision_tx/heads/mask2former/decoder.py",
           "return blocked & ~blocked.all(-1, keepdim=True)", "return blocked", (M2F_MASKED,)),
    Mutant("mask2former decoder: level order not round-robin", "vision_tx/heads/mask2former/decoder.py",
           "level = i % self.num_levels", "level = min(i, self.num_levels - 1)", (M2F,)),
    Mutant("mask2former decoder: self-attention without query positions", "vision_tx/heads/mask2former/decoder.py",
           "        q = queries + query_pos\n", "        q = queries\n", (M2F,)),
    Mutant("mask2former decoder: predictions skip the decoder norm", "vision_tx/heads/mask2former/decoder.py",
           "        normed = self.decoder_norm(queries)\n", "        normed = queries\n", (M2F,)),
    Mutant("mask2former decoder: key positions missing in cross-attention", "vision_tx/heads/mask2former/decoder.py",
           "self.cross_attn(queries + query_pos, memory + memory_pos, memory, attn_mask=attn_mask)",
           "self.cross_attn(queries + query_pos, memory, memory, attn_mask=attn_mask)", (M2F,)),
    Mutant("mask2former decoder: level embedding not added", "vision_tx/heads/mask2former/decoder.py",
           "memory.append(proj(x).flatten(2).transpose(1, 2) + self.level_embed.weight[level])",
           "memory.append(proj(x).flatten(2).transpose(1, 2))", (M2F,)),
    Mutant("mask2former loss: no-object weight 1", "vision_tx/heads/mask2former/criterion.py",
           "        class_weight[-1] = eos_coef\n", "        class_weight[-1] = 1.0\n", (M2F_LOSS,)),
    Mutant("mask2former loss: uncertainty is the logit, not -|logit|", "vision_tx/heads/mask2former/criterion.py",
           "uncertainty = -point_sample(masks, candidates)[:, 0].abs()", "uncertainty = point_sample(masks, candidates)[:, 0]", (M2F_LOSS,)),
    Mutant("mask2former loss: dice without the +1 smoothing", "vision_tx/heads/mask2former/criterion.py",
           "return 1 - (2 * (prob * labels).sum(-1) + 1) / (prob.sum(-1) + labels.sum(-1) + 1)",
           "return 1 - (2 * (prob * labels).sum(-1)) / (prob.sum(-1) + labels.sum(-1) + 1)", (M2F_LOSS,)),
    Mutant("mask2former loss: BCE averaged over masks, not summed / num_masks", "vision_tx/heads/mask2former/criterion.py",
           "reduction=\"none\").mean(1).sum() / num_masks", "reduction=\"none\").mean(1).mean()", (M2F_LOSS, M2F_NUM_MASKS)),
    Mutant("mask2former loss: matching cost without dice", "vision_tx/heads/mask2former/criterion.py",
           "self.cost_mask * cost_mask + self.cost_dice * cost_dice))", "self.cost_mask * cost_mask))", (M2F_LOSS,)),
    Mutant("mask2former loss: matching points not shared by targets and predictions", "vision_tx/heads/mask2former/criterion.py",
           "predicted = point_sample(masks[None], points)[0]  # [Q,P]", "predicted = point_sample(masks[None], points.flip(-1))[0]  # [Q,P]", (M2F_LOSS,)),
    Mutant("mask2former loss: auxiliary predictions left out", "vision_tx/heads/mask2former/criterion.py",
           "        aux = outputs.get(\"aux_outputs\", [])\n", "        aux = []\n", (M2F_LOSS,)),
    Mutant("mask2former loss: all candidates uniform (no importance)", "vision_tx/heads/mask2former/criterion.py",
           "num_uncertain = int(self.importance_sample_ratio * self.num_points)", "num_uncertain = 0", (M2F_LOSS,)),
    Mutant("mask2former semantic: softmax kept the no-object class", "vision_tx/heads/mask2former/postprocess.py",
           "logits.softmax(-1)[..., :-1], masks.sigmoid())", "logits[..., :-1].softmax(-1), masks.sigmoid())", (M2F_SEMANTIC,)),
    Mutant("mask2former panoptic: owner by mask probability alone", "vision_tx/heads/mask2former/postprocess.py",
           "owner = (scores[:, None, None] * probs).argmax(0)", "owner = probs.argmax(0)", (M2F_PANOPTIC, M2F_PANOPTIC_RULES)),
    Mutant("mask2former panoptic: overlap threshold ignored", "vision_tx/heads/mask2former/postprocess.py",
           "or area / original_area < overlap_threshold:", "or area / original_area < 0:", (M2F_PANOPTIC, M2F_PANOPTIC_RULES)),
    Mutant("mask2former panoptic: stuff not merged", "vision_tx/heads/mask2former/postprocess.py",
           "        if not thing and category in stuff_segment:", "        if False:", (M2F_PANOPTIC_RULES,)),
    Mutant("mask2former panoptic: object threshold 0.5 instead of the given", "vision_tx/heads/mask2former/postprocess.py",
           "keep = (classes != logits.shape[-1] - 1) & (scores > object_mask_threshold)",
           "keep = (classes != logits.shape[-1] - 1) & (scores > 0.5)", (M2F_PANOPTIC, M2F_OBJECT_THRESHOLD)),
    Mutant("mask2former instance: mask score over all pixels", "vision_tx/heads/mask2former/postprocess.py",
           "mask_scores = (mask_logits.sigmoid() * foreground).flatten(2).sum(2) / (foreground.flatten(2).sum(2) + 1e-6)",
           "mask_scores = mask_logits.sigmoid().flatten(2).mean(2)", (M2F_INSTANCE,)),
    Mutant("mask2former official: self- and cross-attention norms swapped", "vision_tx/models/mask2former_official.py",
           r'r"transformer_self_attention_layers\.(\d+)\.norm\.", r"predictor.layers.\1.norm2."',
           r'r"transformer_self_attention_layers\.(\d+)\.norm\.", r"predictor.layers.\1.norm1."', (M2F_OFFICIAL,)),
    Mutant("mask2former official: FPN convs counted from the coarsest", "vision_tx/models/mask2former_official.py",
           "kind, index, part = fpn[1], num_fpn_levels - int(fpn[2]), fpn[3]", "kind, index, part = fpn[1], int(fpn[2]), fpn[3]", (M2F_OFFICIAL,)),
    Mutant("mask2former padding: unpadded height and width swapped", "vision_tx/models/mask2former.py",
           "sizes = torch.stack([(~pixel_mask[:, :, 0]).sum(1), (~pixel_mask[:, 0, :]).sum(1)], -1)",
           "sizes = torch.stack([(~pixel_mask[:, 0, :]).sum(1), (~pixel_mask[:, :, 0]).sum(1)], -1)", (M2F_PADDING,)),
    Mutant("mask2former padding: targets padded by the height's amount in width and the width's in height", "vision_tx/models/mask2former.py",
           'F.pad(t["masks"], (0, width - t["masks"].shape[-1], 0, height - t["masks"].shape[-2]))',
           'F.pad(t["masks"], (0, height - t["masks"].shape[-2], 0, width - t["masks"].shape[-1]))', (M2F_PADDING,)),
    Mutant("mask2former padding: targets padded at the top and left", "vision_tx/models/mask2former.py",
           'F.pad(t["masks"], (0, width - t["masks"].shape[-1], 0, height - t["masks"].shape[-2]))',
           'F.pad(t["masks"], (width - t["masks"].shape[-1], 0, height - t["masks"].shape[-2], 0))', (M2F_PADDING,)),
    Mutant("mask2former instance: query and class of a pair swapped", "vision_tx/heads/mask2former/postprocess.py",
           "query, labels = torch.div(index, num_classes, rounding_mode=\"floor\"), index % num_classes",
           "query, labels = index % num_classes, torch.div(index, num_classes, rounding_mode=\"floor\")", (M2F_INSTANCE,)),
    # The learning comparison's COCO <-> YOLO conversion and scoring (scripts/compare_detection.py)
    Mutant("compare detection: the GPU side in fp32", "scripts/compare_detection.py",
           '"--trainer.devices", "1", "--trainer.precision", GPU_PRECISION]', '"--trainer.devices", "1"]', (YOLO_LABELS,)),
    Mutant("compare detection: the CPU side left to Lightning's choice", "scripts/compare_detection.py",
           'return ["--trainer.accelerator", "cpu"]', "return []", (YOLO_LABELS,)),
    Mutant("compare detection: a kept YOLO run reused at another seed", "scripts/compare_detection.py",
           '"model": name, "budget_seconds": budget, "seed": args.seed,', '"model": name, "budget_seconds": budget,', (YOLO_LABELS,)),
    Mutant("compare detection: a YOLO run of no fixed budget kept", "scripts/compare_detection.py",
           "if args.use_yolo_cache and args.budget_seconds is not None else None", "if args.use_yolo_cache else None",
           (YOLO_LABELS,)),
    Mutant("compare detection: the suite's mean over the sets a side ran on", "scripts/compare_detection.py",
           "for side, rows in table.items() if len(rows) == len(reports)}", "for side, rows in table.items()}", (YOLO_LABELS,)),
    Mutant("compare detection: YOLO alone without a budget", "scripts/compare_detection.py",
           "if not args.vision_tx and (args.budget_seconds is None or not args.yolo):",
           "if not args.vision_tx and not args.yolo:", (YOLO_LABELS,)),
    Mutant("compare detection: YOLO centre x divided by the height", "scripts/compare_detection.py",
           'lines.append(f"{classes[ann[\'category_id\']]} {(x + w / 2) / width:.10f}',
           'lines.append(f"{classes[ann[\'category_id\']]} {(x + w / 2) / height:.10f}', (YOLO_LABELS,)),
    Mutant("compare detection: crowd regions labelled for YOLO", "scripts/compare_detection.py",
           'if ann.get("iscrowd", 0):\n            continue', 'if False:\n            continue', (YOLO_LABELS,)),
    Mutant("compare detection: YOLO classes in the file's category order", "scripts/compare_detection.py",
           'return sorted(c["id"] for c in dataset["categories"])', 'return [c["id"] for c in dataset["categories"]]',
           (YOLO_LABELS,)),
    Mutant("compare detection: YOLO boxes back as corners, not width and height", "scripts/compare_detection.py",
           '"bbox": [float(x0), float(y0), float(x1) - float(x0), float(y1) - float(y0)]}',
           '"bbox": [float(x0), float(y0), float(x1), float(y1)]}', (YOLO_LABELS,)),
    Mutant("compare detection: YOLO label read back with the corner as the centre", "scripts/compare_detection.py",
           "np.concatenate([centre - size / 2, centre + size / 2], axis=1)", "np.concatenate([centre, centre + size], axis=1)",
           (YOLO_LABELS,)),
    Mutant("compare detection: the score floor excluded", "scripts/compare_detection.py",
           'if r["score"] >= SCORE_FLOOR:', 'if r["score"] > SCORE_FLOOR:', (YOLO_LABELS,)),
    Mutant("compare detection: 101 detections an image kept", "scripts/compare_detection.py",
           'key=lambda r: -r["score"])[:MAX_DETECTIONS]]', 'key=lambda r: -r["score"])[:MAX_DETECTIONS + 1]]', (YOLO_LABELS,)),
    Mutant("compare detection: the round-trip check lets a box off by a pixel pass", "scripts/compare_detection.py",
           'if ap != 1.0 or errors[split] > ROUND_TRIP_TOLERANCE_PX:', 'if ap < 0.5:', (YOLO_LABELS,)),
    Mutant("compare detection: the round trip pairs a class's boxes in sorted order", "scripts/compare_detection.py",
           "rows, columns = linear_sum_assignment(differences)",
           "rows, columns = np.lexsort(np.asarray(expected, dtype=float).T[::-1]), np.lexsort(np.asarray(found, dtype=float).T[::-1])",
           (YOLO_LABELS,)),
    Mutant("compare detection: AP at each high IoU read at the threshold below", "scripts/compare_detection.py",
           'precision = evaluation.eval["precision"][index, :, :,', 'precision = evaluation.eval["precision"][index - 1, :, :,',
           (YOLO_LABELS,)),
    Mutant("compare detection: AP at a high IoU over the large objects only", "scripts/compare_detection.py",
           'evaluation.params.areaRngLbl.index("all")', 'evaluation.params.areaRngLbl.index("large")', (YOLO_LABELS,)),
    Mutant("compare detection: classes kept apart in the merged score", "scripts/compare_detection.py",
           "evaluation.params.useCats = int(classes)", "evaluation.params.useCats = 1", (YOLO_LABELS,)),
    Mutant("compare detection: a detection on an object of its own class counted a wrong class", "scripts/compare_detection.py",
           "bool((ious[same] < iou_threshold).all() and (ious[~same] >= iou_threshold).any())",
           "bool((ious[~same] >= iou_threshold).any())", (YOLO_LABELS,)),
    Mutant("compare detection: a wrong class needs IoU above 0.52", "scripts/compare_detection.py",
           "(ious[~same] >= iou_threshold).any()", "(ious[~same] > iou_threshold + 0.02).any()", (YOLO_LABELS,)),
    Mutant("compare detection: crowd regions count as objects for the wrong classes", "scripts/compare_detection.py",
           'if not annotation.get("iscrowd", 0):\n            objects[', 'if True:\n            objects[', (YOLO_LABELS,)),
    Mutant("compare detection: the wrong-class detections kept in the score without them", "scripts/compare_detection.py",
           "kept = [result for result, wrong in zip(results, flags) if not wrong]", "kept = list(results)", (YOLO_LABELS,)),
    Mutant("long-run augmentation: the mosaics stop in the epoch of the drop", "vision_tx/lightning/augmentation.py",
           "closed = self.drop_epoch is not None and epoch > self.drop_epoch", "closed = self.drop_epoch is not None and epoch >= self.drop_epoch",
           (LONG_RUN_AUGMENTATION,)),
    Mutant("long-run augmentation: the epoch of the drop not restored on resume", "vision_tx/lightning/augmentation.py",
           'state_dict["on_epoch"], state_dict["drop_epoch"]', 'state_dict["on_epoch"], None', (LONG_RUN_AUGMENTATION,)),
    Mutant("long-run augmentation: the first learning rate taken for a drop", "vision_tx/lightning/augmentation.py",
           'group["lr"] < group.get("initial_lr", group["lr"])', 'group["lr"] <= group.get("initial_lr", group["lr"])', (LONG_RUN_AUGMENTATION,)),
    Mutant("long-run augmentation: a run of exactly min_epochs taken for short", "vision_tx/lightning/augmentation.py",
           "planned >= self.min_epochs", "planned > self.min_epochs", (LONG_RUN_AUGMENTATION,)),
    Mutant("long-run augmentation: a step run's accumulated batches not counted", "vision_tx/lightning/augmentation.py",
           "trainer.max_steps * trainer.accumulate_grad_batches / self.batches_per_epoch(trainer)",
           "trainer.max_steps / self.batches_per_epoch(trainer)", (LONG_RUN_AUGMENTATION,)),
    Mutant("long-run augmentation: a budget run's pace read without the epochs done", "vision_tx/lightning/augmentation.py",
           "trainer.current_epoch * 60 * budget.minutes / seconds", "60 * budget.minutes / seconds", (LONG_RUN_AUGMENTATION,)),
    Mutant("long-run augmentation: the affine closed with the mosaics", "vision_tx/lightning/augmentation.py",
           "closes = name in CLOSED_AT_DROP and closed", "closes = closed", (LONG_RUN_AUGMENTATION,)),
    Mutant("long-run augmentation: the messages name augmentations the config leaves at 0", "vision_tx/lightning/augmentation.py",
           'self.names = " and ".join(AUGMENTATIONS[name][0] for name, *_ in self._switches)', "pass", (LONG_RUN_AUGMENTATION,)),
    Mutant("long-run augmentation: mixup not closed at the drop", "vision_tx/lightning/augmentation.py",
           'CLOSED_AT_DROP = ("mosaic", "mixup", "copy_paste")', 'CLOSED_AT_DROP = ("mosaic", "copy_paste")', (LONG_RUN_AUGMENTATION,)),
    Mutant("long-run augmentation: copy-paste not closed at the drop", "vision_tx/lightning/augmentation.py",
           'CLOSED_AT_DROP = ("mosaic", "mixup", "copy_paste")', 'CLOSED_AT_DROP = ("mosaic", "mixup")', (LONG_RUN_AUGMENTATION,)),
    Mutant("long-run augmentation: mixup switched through the mosaics' probability", "vision_tx/lightning/augmentation.py",
           '("train_dataset",), "mixup_probability"', '("train_dataset",), "probability"', (LONG_RUN_AUGMENTATION,)),
    Mutant("long-run augmentation: a short run given the configured augmentations", "vision_tx/lightning/augmentation.py",
           "wanted = configured if on else 0.0", "wanted = configured", (LONG_RUN_AUGMENTATION,)),
    Mutant("long-run augmentation: every instance kept under one checkpoint key", "vision_tx/lightning/augmentation.py",
           "return self._generate_state_key(min_epochs=self.min_epochs, augmentations=self.augmentations)",
           "return type(self).__qualname__", (LONG_RUN_AUGMENTATION,)),
    Mutant("long-run augmentation: the augmentations named ignored (mosaics and affine always)", "vision_tx/lightning/augmentation.py",
           "for name in self.augmentations:", 'for name in ("mosaic", "affine"):', (LONG_RUN_AUGMENTATION,)),
    Mutant("long-run augmentation: epoch 0's augmentations set at its start, after the first worker batches", "vision_tx/lightning/augmentation.py",
           "        self._apply(0)", "        pass", (LONG_RUN_AUGMENTATION,)),
    Mutant("long-run augmentation: a step plan never decided", "vision_tx/lightning/augmentation.py",
           "self._decide(trainer, epoch=0)", "pass", (LONG_RUN_AUGMENTATION,)),
    Mutant("long-run augmentation: a resumed run's first batches left as the fresh datamodule has them", "vision_tx/lightning/augmentation.py",
           'self._apply(state_dict["next_epoch"])', "pass", (LONG_RUN_AUGMENTATION,)),
    Mutant("long-run augmentation: a run resumed at an epoch's end draws its first batches as that epoch's", "vision_tx/lightning/augmentation.py",
           "trainer.current_epoch + (batch_idx + 1 >= trainer.num_training_batches)", "trainer.current_epoch", (LONG_RUN_AUGMENTATION,)),
    Mutant("long-run augmentation: a plain sampler's batches not split over the processes", "vision_tx/lightning/augmentation.py",
           "batches = math.ceil(batches / trainer.world_size)", "pass", (LONG_RUN_AUGMENTATION,)),
    Mutant("long-run augmentation: limit_train_batches ignored", "vision_tx/lightning/augmentation.py",
           "return max(min(batches, limit) if isinstance(limit, int) else int(batches * limit), 1)", "return batches",
           (LONG_RUN_AUGMENTATION,)),
    Mutant("shared probability: kept in the process's own memory (persistent workers never see a change)", "vision_tx/data/shared_probability.py",
           "torch.tensor(value, dtype=torch.float64).share_memory_()", "torch.tensor(value, dtype=torch.float64)", (LONG_RUN_AUGMENTATION,)),
    Mutant("mosaic: a number drawn at probability 0", "vision_tx/data/mosaic.py",
           "if probability > 0 and float(torch.rand(())) < probability:", "if float(torch.rand(())) < probability:", (MOSAIC,)),
    Mutant("mixup: a number drawn at probability 0", "vision_tx/data/mosaic.py",
           "if mixup_probability > 0 and float(torch.rand(())) < mixup_probability:", "if float(torch.rand(())) < mixup_probability:", (MOSAIC,)),
    Mutant("mixup: the other image's boxes not moved with it", "vision_tx/data/mosaic.py",
           "moved = moved + torch.tensor([left, top, left, top], dtype=torch.float32)", "moved = moved + 0", (MOSAIC,)),
    Mutant("mixup: the other image's boxes scaled as if stretched to the canvas", "vision_tx/data/mosaic.py",
           "torch.tensor([new_w / other_w, new_h / other_h] * 2)", "torch.tensor([width / other_w, height / other_h] * 2)", (MOSAIC,)),
    Mutant("mixup: the other image's labels dropped", "vision_tx/data/mosaic.py",
           '"labels": torch.cat([target["labels"], other_target["labels"]]),', '"labels": target["labels"],', (MOSAIC,)),
    Mutant("mixup: the other image stretched to the canvas", "vision_tx/data/mosaic.py",
           "scale = min(height / other_h, width / other_w)", "scale = max(height / other_h, width / other_w)", (MOSAIC,)),
    Mutant("mixup: the image kept at nine tenths", "vision_tx/data/mosaic.py",
           "weight = float(torch.distributions.Beta(MIXUP_BETA, MIXUP_BETA).sample())", "weight = 0.9", (MOSAIC,)),
    Mutant("detection data: mixup alone leaves the split unwrapped", "vision_tx/data/detection.py",
           "if self.mosaic_probability == 0 and self.mixup_probability == 0 and self.copy_paste_probability == 0:",
           "if self.mosaic_probability == 0 and self.copy_paste_probability == 0:",
           ("tests/data/test_detection.py::test_mosaics_or_mixup_alone_wrap_the_training_split",)),
    Mutant("detection data: the masks read where an object has none", "vision_tx/data/detection.py",
           "        if missing:\n            logger.info(", "        if False:\n            logger.info(", (COPY_PASTE_DATA,)),
    Mutant("detection data: copy-paste off where an object has no mask", "vision_tx/data/detection.py",
           "copy_paste_probability=self.copy_paste_probability,",
           "copy_paste_probability=self.copy_paste_probability * (masks is not None),", (COPY_PASTE_DATA,)),
    Mutant("detection data: the box-only path taken where every object has a mask", "vision_tx/data/detection.py",
           "        return instances, instances.instance_masks", "        return instances, None", (COPY_PASTE_DATA,)),
    Mutant("detection data: every training item's masks decoded for copy-paste", "vision_tx/data/detection.py",
           "masks_in_targets=False)", "masks_in_targets=True)", (COPY_PASTE_DATA,)),
    Mutant("coco instances: the masks decoded where the targets leave them out", "vision_tx/data/coco_instances.py",
           "        if self.masks_in_targets:", "        if True:", (COCO_INSTANCES,)),
    Mutant("coco instances: the masks of the next image's objects", "vision_tx/data/coco_instances.py",
           "start, end = self.offsets[index], self.offsets[index + 1]",
           "start, end = self.offsets[index + 1], self.offsets[min(index + 2, len(self.offsets) - 1)]", (COCO_INSTANCES,)),
    Mutant("coco instances: an object with an empty segmentation not counted", "vision_tx/data/coco_instances.py",
           "if not segmentation)", "if segmentation is None)", (COCO_INSTANCES,)),
    Mutant("copy-paste: a box-only object's box moved as its whole pixels", "vision_tx/data/mosaic.py",
           "box - torch.tensor([x0, y0, x0, y0], dtype=torch.float32), label", "torch.tensor([0.0, 0.0, x1 - x0, y1 - y0]), label",
           (MOSAIC,)),
    Mutant("copy-paste: a flipped patch's box not mirrored", "vision_tx/data/mosaic.py",
           "local_box = torch.stack([shape.shape[1] - local_box[2], local_box[1], shape.shape[1] - local_box[0], local_box[3]])",
           "local_box = local_box", (MOSAIC,)),
    Mutant("copy-paste: a box without pixels pasted", "vision_tx/data/mosaic.py",
           "            if x1 > x0 and y1 > y0:", "            if True:", (MOSAIC,)),
    Mutant("copy-paste: the object's whole box pasted, not its mask", "vision_tx/data/mosaic.py",
           "region.copy_(torch.where(shape, patch, region))", "region.copy_(patch)", (MOSAIC,)),
    Mutant("copy-paste: pasted over the objects already there", "vision_tx/data/mosaic.py",
           "free = torch.nonzero(~overlaps).flatten()", "free = torch.arange(PASTE_ATTEMPTS)", (MOSAIC,)),
    Mutant("matcher: each target paired with the queries of the next image", "vision_tx/heads/detr/matcher.py",
           "queries = image_of_target * num_queries", "queries = (image_of_target + 1) % batch * num_queries",
           ("tests/heads/test_detr_matcher.py",)),
    Mutant("matcher: the L1 cost of the first target's box for every target", "vision_tx/heads/detr/matcher.py",
           "(out_boxes[queries] - boxes).abs().sum(-1)", "(out_boxes[queries] - boxes[:1]).abs().sum(-1)", ("tests/heads/test_detr_matcher.py",)),
    Mutant("image reading: the EXIF orientation skipped", "vision_tx/data/image_io.py",
           "if exif_orientation(stored) != 1 else stored", "if exif_orientation(stored) == 1 else stored",
           ("tests/data/test_coco.py", "tests/data/test_bad_input.py")),
    Mutant("image reading: every mode taken as RGB", "vision_tx/data/image_io.py",
           'image if image.mode == "RGB" else image.convert("RGB")', "image",
           ("tests/data/test_coco.py", "tests/data/test_bad_input.py")),
    Mutant("copy-paste: one place tried an object", "vision_tx/data/mosaic.py",
           "PASTE_ATTEMPTS = 20", "PASTE_ATTEMPTS = 1", (MOSAIC,)),
    Mutant("copy-paste: never flipped", "vision_tx/data/mosaic.py",
           "            if float(torch.rand(())) < 0.5:\n                patch, shape", "            if float(torch.rand(())) < 0.0:\n                patch, shape", (MOSAIC,)),
    Mutant("copy-paste: cut along the boxes where the masks are given", "vision_tx/data/mosaic.py",
           "        if self.masks is None:\n            return image, target", "        if True:\n            return image, target",
           (MOSAIC,)),
    Mutant("copy-paste: the masks of another image than the one pasted from", "vision_tx/data/mosaic.py",
           '"masks": self.masks(index)}', '"masks": self.masks((index + 1) % len(self))}', (MOSAIC,)),
    Mutant("copy-paste: a number drawn at probability 0", "vision_tx/data/mosaic.py",
           "if copy_paste_probability > 0 and float(torch.rand(())) < copy_paste_probability:",
           "if float(torch.rand(())) < copy_paste_probability:", (MOSAIC,)),
    Mutant("copy-paste: an object too large on one side only is pasted", "vision_tx/data/mosaic.py",
           "if patch_h > height or patch_w > width:", "if patch_h > height and patch_w > width:", (MOSAIC,)),
    Mutant("copy-paste: the object's height held against the image's width", "vision_tx/data/mosaic.py",
           "if patch_h > height or patch_w > width:", "if patch_h > width or patch_w > height:", (MOSAIC,)),
    # The deployment form of exported models (vision_tx/deploy.py)
    Mutant("deploy: RepVGG's 1x1 branch dropped when merged", "vision_tx/deploy.py",
           "merged.weight.copy_(conv3.weight + nn.functional.pad(conv1.weight, (1, 1, 1, 1)))", "merged.weight.copy_(conv3.weight)",
           (DEPLOY,)),
    Mutant("deploy: a norm folded into the next 1x1 convolution without its shift", "vision_tx/deploy.py",
           "fused.bias.copy_((conv.bias if conv.bias is not None else 0) + conv.weight.flatten(1) @ shift)",
           "fused.bias.copy_(conv.bias if conv.bias is not None else torch.zeros_like(fused.bias))", (DEPLOY,)),
    Mutant("deploy: ConvNeXt's layer scale left out of the MLP's bias", "vision_tx/deploy.py",
           "fc2.bias = nn.Parameter(fc2.bias * module.gamma)", "fc2.bias = nn.Parameter(fc2.bias.clone())", (DEPLOY,)),
    Mutant("deploy: grid_sample attention with corner-aligned samples", "vision_tx/deploy.py",
           'mode="bilinear", padding_mode="zeros", align_corners=False)', 'mode="bilinear", padding_mode="zeros", align_corners=True)',
           (DEPLOY,)),
    # YOLO and VOC layouts read as COCO
    Mutant("layouts: VOC corners read as 0-based", "vision_tx/data/layouts.py",
           "x, y, w, h = xmin - 1, ymin - 1, xmax - xmin + 1, ymax - ymin + 1", "x, y, w, h = xmin, ymin, xmax - xmin, ymax - ymin",
           (LAYOUTS,)),
    Mutant("layouts: YOLO class k read as category id k", "vision_tx/data/layouts.py",
           'annotations.append({"category_id": int(values[0]) + 1,', 'annotations.append({"category_id": int(values[0]),',
           (LAYOUTS,)),
    Mutant("layouts: VOC difficult objects trained on", "vision_tx/data/layouts.py",
           '"iscrowd": int(difficult)}', '"iscrowd": 0}', (LAYOUTS,)),
    Mutant("far outside: the slack of the side's fraction dropped", "vision_tx/data/coco.py",
           "slack_x, slack_y = np.maximum(2.0, OUTSIDE_TOLERANCE * width), np.maximum(2.0, OUTSIDE_TOLERANCE * height)",
           "slack_x, slack_y = 2.0, 2.0", ("tests/data/test_coco.py", "tests/data/test_bad_input.py", LAYOUTS)),
    Mutant("layouts: a YOLO box outside the image accepted", "vision_tx/data/layouts.py",
           "            if far_outside(x, y, x + w, y + h, height, width):\n", "            if False:\n", (LAYOUTS,)),
    # Prediction over tiles
    Mutant("predict: tile boxes not shifted back into the image", "vision_tx/lightning/predict.py",
           "shifted = found[\"boxes\"].float() + torch.tensor([x0, y0, x0, y0], dtype=torch.float32)",
           "shifted = found[\"boxes\"].float()", (PREDICT,)),
    Mutant("predict: boxes cut by a tile's far side kept", "vision_tx/lightning/predict.py",
           "        cut |= ((shifted[:, 2:] >= far) & torch.tensor([x1 < width, y1 < height])).any(1)\n", "", (PREDICT,)),
    Mutant("predict: NMS across classes", "vision_tx/lightning/predict.py",
           "keep = batched_nms(boxes, scores.float(), labels, iou_threshold)",
           "keep = batched_nms(boxes, scores.float(), torch.zeros_like(labels), iou_threshold)", (PREDICT,)),
    # The validation report
    Mutant("detection report: unmatched detections counted as misses", "vision_tx/metrics/detection_report.py",
           "                matrix[background, index[label]] += 1", "                matrix[index[label], background] += 1",
           (DETECTION_REPORT,)),
    Mutant("detection report: a match needs IoU above the threshold", "vision_tx/metrics/detection_report.py",
           "rows, columns = torch.nonzero(iou >= iou_threshold, as_tuple=True)",
           "rows, columns = torch.nonzero(iou > iou_threshold, as_tuple=True)", (DETECTION_REPORT,)),
    Mutant("detection report: a validation's evaluation read at one area range of its four", "vision_tx/metrics/detection_report.py",
           "images, areas = len(params.imgIds), len(params.areaRng)", "images, areas = len(params.imgIds), 1", (DETECTION_REPORT,)),
    Mutant("detection report: precision at one detection an image, not 100", "vision_tx/metrics/detection_report.py",
           'precision = evaluator.eval["precision"][0, :, :, 0, -1]', 'precision = evaluator.eval["precision"][0, :, :, 0, 0]',
           (DETECTION_REPORT,)),
    Mutant("detection report: detections under the threshold in the matrix", "vision_tx/metrics/detection_report.py",
           'keep = (found["scores"] >= score_threshold) & known', "keep = known", (DETECTION_REPORT,)),
    Mutant("transforms: the switched-off affine draws a number", "vision_tx/data/transforms.py",
           "        if self.p == 0:\n            return inputs", "        if False:\n            return inputs", (AFFINE,)),
    Mutant("budget: the training clock counts the validations", "vision_tx/lightning/budget.py",
           "def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:\n        self._pause()",
           "def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:\n        pass",
           (TRAINING_BUDGET,)),
    Mutant("budget: the CPU seconds of the last training stretch only", "vision_tx/lightning/budget.py",
           "self.cpu += time.process_time() - self._started[1]", "self.cpu = time.process_time() - self._started[1]",
           (TRAINING_BUDGET,)),
    Mutant("budget: the wall-clock of the last training stretch only", "vision_tx/lightning/budget.py",
           "return self.spent + (time.perf_counter() - self._started[0] if self._started else 0.0)",
           "return time.perf_counter() - self._started[0] if self._started else self.spent", (TRAINING_BUDGET,)),
    Mutant("budget: the run does not stop at its budget", "vision_tx/lightning/budget.py",
           "trainer.should_stop = True", "trainer.should_stop = False", (TRAINING_BUDGET,)),
    Mutant("budget: the step limit stays", "vision_tx/lightning/budget.py",
           "trainer.fit_loop.epoch_loop.max_steps = -1", "pass", (TRAINING_BUDGET,)),
    Mutant("budget: the drop comes at half its step's fraction of the time", "vision_tx/lightning/budget.py",
           "sum(fraction * self.planned_steps >= m for m in self.milestones)", "sum(fraction * self.planned_steps >= m / 2 for m in self.milestones)",
           (TRAINING_BUDGET,)),
    Mutant("budget: the config's own drop still fires", "vision_tx/lightning/budget.py",
           "scheduler.milestones = Counter()", "pass", (TRAINING_BUDGET,)),
    Mutant("budget: a resumed run loses its plan", "vision_tx/lightning/budget.py",
           'self.milestones, self.gamma = state_dict.get("milestones", []), state_dict.get("gamma", 1.0)', "pass", (TRAINING_BUDGET,)),
    Mutant("budget: the spent time is not restored", "vision_tx/lightning/budget.py",
           'self.spent, self.drops = state_dict["spent"], state_dict["drops"]', 'self.drops = state_dict["drops"]', (TRAINING_BUDGET,)),
    Mutant("budget: under DDP only the first process's images are counted", "vision_tx/lightning/budget.py",
           "self.images, self.cpu = int(images), cpu", "pass", (TRAINING_BUDGET,)),
    Mutant("budget: the summary is not written to metrics.json", "vision_tx/lightning/budget.py",
           'merge_metrics_json("training", self.summary(), Path(log_dir) / "metrics.json")', "pass", (TRAINING_BUDGET,)),
    Mutant("compare detection: each process gets the config's whole batch", "scripts/compare_detection.py",
           'batch = ["--data.batch_size", str(config_batch // args.processes)]', "batch = []", (YOLO_LABELS,)),
    Mutant("compare detection: the processes are not given their share of the threads", "scripts/compare_detection.py",
           'env={**os.environ, "OMP_NUM_THREADS": str(args.threads // args.processes)}', "env=os.environ", (YOLO_LABELS,)),
    Mutant("mal: the target is the IoU, not a power of it", "vision_tx/heads/rtdetr/criterion.py",
           "score[positives] = iou.to(logits.dtype).pow(self.mal_gamma)", "score[positives] = iou.to(logits.dtype)", (MAL,)),
    Mutant("mal: positives weighted by their IoU (the varifocal weight)", "vision_tx/heads/rtdetr/criterion.py",
           "* (1 - onehot) + onehot", "* (1 - onehot) + score", (MAL,)),
    Mutant("mal: mal_alpha ignored", "vision_tx/heads/rtdetr/criterion.py",
           "(1.0 if self.mal_alpha is None else self.mal_alpha)", "1.0", (MAL,)),
    # The held-out classification set and the comparison's top-k
    Mutant("shapes classification: the added classes draw the first outline", "scripts/make_shapes_classification.py",
           "_paint(image, _shape_mask(rng, kind, side, side, box, CLASSES), rng)", "_paint(image, _shape_mask(rng, kind % 6, side, side, box), rng)",
           (SHAPES_CLASSIFICATION,)),
    Mutant("compare classification: top-5 counts the 6 best", "scripts/compare_classification.py",
           "hits[k] += int((ranked[:, :k] == labels[:, None]).any(dim=1).sum())",
           "hits[k] += int((ranked[:, :k + 1] == labels[:, None]).any(dim=1).sum())", (SHAPES_CLASSIFICATION,)),
    # Weight decay exemptions (no_weight_decay and the optimiser's groups)
    Mutant("no weight decay: swin bias tables decayed", "vision_tx/backbones/swin.py",
           "return norms_and_biases(self) | tables", "return norms_and_biases(self)", (f"{NO_DECAY}[swin_t]",)),
    Mutant("no weight decay: vit tokens and position embeddings decayed", "vision_tx/backbones/vit.py",
           'return norms_and_biases(self) | {f"stem.{name}"', 'return norms_and_biases(self) or {f"stem.{name}"', (f"{NO_DECAY}[deit_tiny_distilled]",)),
    Mutant("no weight decay: biases decayed", "vision_tx/backbones/base.py",
           "if param.ndim <= 1}", "if param.ndim < 1}", (f"{NO_DECAY}[resnet50]",)),
    Mutant("no weight decay: the optimiser ignores it", "vision_tx/lightning/common.py",
           "decay = 0.0 if name in no_decay else weight_decay", "decay = weight_decay", (NO_DECAY_GROUPS,)),
    Mutant("no weight decay: detection ignores the recipe's option", "vision_tx/lightning/detection.py",
           "decay_norms_and_biases=hp.decay_norms_and_biases, backbone_prefix", "backbone_prefix", (TASK_DECAY,)),
    Mutant("no weight decay: segmentation ignores the recipe's option", "vision_tx/lightning/segmentation.py",
           "decay_norms_and_biases=hp.decay_norms_and_biases)", "decay_norms_and_biases=False)", (TASK_DECAY,)),
    Mutant("no weight decay: classification ignores the recipe's option", "vision_tx/lightning/classification.py",
           "decay_norms_and_biases=hp.decay_norms_and_biases)", "decay_norms_and_biases=False)", (TASK_DECAY,)),
    Mutant("fused AdamW: fused under mixed precision too, where Lightning refuses to clip", "vision_tx/lightning/common.py",
           'and precision not in ("16-mixed", "bf16-mixed")', "", (FUSED_ADAMW,)),
    Mutant("fused AdamW: under mixed precision the loop, torch's multi-tensor step turned off", "vision_tx/lightning/common.py",
           "fused=fused or None", "fused=fused", (FUSED_ADAMW,)),
    Mutant("normalised targets: the boxes divided by (h, w, h, w)", "vision_tx/heads/detr/criterion.py",
           'scale = target["size"].flip(-1).repeat(2)', 'scale = target["size"].repeat(2)',
           ("tests/heads/test_detr_criterion.py::test_normalize_targets_gives_relative_cxcywh",)),
    Mutant("fused AdamW: detection builds the loop over parameters", "vision_tx/lightning/detection.py",
           "optimizer = adamw(self, groups)", "optimizer = torch.optim.AdamW(groups)", (FUSED_ADAMW,)),
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
    # Exported models (vision_tx/export.py): the post-processing inside, against the eager one
    Mutant("export: image size read as (w, h): boxes scaled by the wrong sides", "vision_tx/export.py",
           "torch.tensor([height, width], device=images.device)", "torch.tensor([width, height], device=images.device)",
           (f"{EXPORT}[detr_swin_toy]",)),
    Mutant("export: input normalised without the standard deviation", "vision_tx/export.py",
           "return (images - self.pixel_mean.to(images.dtype)) / self.pixel_std.to(images.dtype)",
           "return images - self.pixel_mean.to(images.dtype)", (f"{EXPORT}[classification_toy]",)),
    Mutant("export: NMS across classes (per image only)", "vision_tx/export.py",
           "groups = labels + (labels.max() + 1) * torch.arange", "groups = 0 * labels + (labels.max() + 1) * torch.arange",
           (EXPORT_NMS, f"{EXPORT}[rtdetr_convnext_toy]")),
    Mutant("export: NMS suppressed-first (the lower-scoring of two overlapping boxes kept)", "vision_tx/export.py",
           "kept = nms((boxes + offsets).flatten(0, 1), scores.flatten(), threshold)",
           "kept = nms((boxes + offsets).flatten(0, 1), -scores.flatten(), threshold)", (EXPORT_NMS,)),
    Mutant("export: share_scores ignored (the plain sigmoid scores)", "vision_tx/export.py",
           "sigmoid_candidates(outputs, candidates, self.network.share_scores)", "sigmoid_candidates(outputs, candidates)",
           (EXPORT_SHARED,)),
    Mutant("export: DETR no-object wins (its class in the argmax)", "vision_tx/export.py",
           'scores, labels = outputs["pred_logits"].softmax(-1)[..., :-1].max(-1)',
           'scores, labels = outputs["pred_logits"].softmax(-1).max(-1)', (EXPORT_NO_OBJECT,)),
    Mutant("export: DINO's queries expanded to len(boxes) (the batch fixed at the traced one)", "vision_tx/models/dino.py",
           "expand(boxes.shape[0], -1, -1)", "expand(len(boxes), -1, -1)", (f"{EXPORT}[dino_swin_toy]",)),
    Mutant("export: Mask2Former's sizes repeated len(images) times (the batch fixed)", "vision_tx/models/mask2former.py",
           "sizes = torch.tensor(list(images.shape[-2:]), device=images.device).repeat(images.shape[0], 1)",
           "sizes = torch.tensor([images.shape[-2:]] * len(images), device=images.device)",
           (f"{EXPORT}[mask2former_swin_toy_coco_instance]",)),
    Mutant("export: instances worst first", "vision_tx/export.py",
           "order = scores.argsort(dim=1, descending=True)", "order = scores.argsort(dim=1)", (f"{EXPORT}[mask2former_swin_toy_coco_instance]",)),
    Mutant("export: panoptic stuff queries not merged into one segment", "vision_tx/export.py",
           "first = torch.where(self.thing[classes], index, same.long().argmax(-1))", "first = index + 0 * same.long().argmax(-1)",
           (f"{EXPORT}[mask2former_swin_toy_coco_panoptic]", EXPORT_DETR_PANOPTIC)),
    Mutant("export tool: a panoptic model's things not read from the datamodule", "vision_tx/export.py",
           "is_thing = datamodule.is_thing if isinstance(module, PanopticModule) else None", "is_thing = None", (EXPORT_TOOL_PANOPTIC,)),
    Mutant("export: DETR panoptic in one round (small segments neither dropped nor their pixels re-assigned)", "vision_tx/export.py",
           "for _ in range(2):", "for _ in range(1):", (EXPORT_DETR_PANOPTIC,)),
    Mutant("export: DETR panoptic keeps queries of categories the dataset does not have", "vision_tx/export.py",
           'kept = (classes != logits.shape[-1] - 1) & (scores > settings["threshold"]) & self.known[classes]',
           'kept = (classes != logits.shape[-1] - 1) & (scores > settings["threshold"])', (EXPORT_DETR_PANOPTIC,)),
    Mutant("export: panoptic overlap threshold ignored", "vision_tx/export.py",
           "& (ratio >= self.network.overlap_threshold)", "& (ratio >= 0)", (f"{EXPORT}[mask2former_swin_toy_coco_panoptic]",)),
    Mutant("export: classifier probabilities over the wrong axis", "vision_tx/export.py",
           "probabilities = self.network(self.normalize(images)).softmax(-1)", "probabilities = self.network(self.normalize(images)).softmax(0)",
           (f"{EXPORT}[classification_toy]",)),
    # Benchmarks on a GPU (benchmarks/timing.py): each side's peak memory measured, kept and printed
    Mutant("benchmark: compare drops the GPU peak memory", "benchmarks/timing.py",
           "ours_peak_bytes=peak_bytes(ours, device), reference_peak_bytes=peak_bytes(reference, device))", ")",
           (f"{BENCHMARK_PEAKS}::test_compare_on_cuda_measures_each_sides_peak_of_one_call",)),
    Mutant("benchmark: rows merged over processes drop the peaks", "benchmarks/timing.py",
           "largest([r.ours_peak_bytes for r in rows]), largest([r.reference_peak_bytes for r in rows]))", ")",
           (f"{BENCHMARK_PEAKS}::test_peaks_survive_the_hand_off_between_processes_and_merge_to_the_largest",)),
    Mutant("export every config: a detection must sit at its eager position", "scripts/export_every_config.py",
           "found += bool((close & (got_labels[b] == labels[b, i])", "found += bool((close[i:i + 1] & (got_labels[b, i:i + 1] == labels[b, i])",
           (f"{EXPORT_EVERY}::test_agreement_counts_detections_found_anywhere_and_equal_pixels",)),
    Mutant("export: ms_deform_attn through embedding_bag (an ONNX loop over the samples)", "vision_tx/ops/ms_deform_attn.py",
           "        if torch.compiler.is_exporting():  # ONNX has no EmbeddingBag", "        if False:  # ONNX has no EmbeddingBag",
           ("tests/test_export.py::test_ms_deform_attn_exports",)),
    Mutant("export: ms_deform_attn's exported gather-sum without the bilinear weights", "vision_tx/ops/ms_deform_attn.py",
           "            return (rows * corner_weights.flatten(1)[..., None]).sum(1)", "            return rows.sum(1)",
           ("tests/test_export.py::test_ms_deform_attn_exports",)),
    Mutant("export every config: panoptic segments compared by their numbers", "scripts/export_every_config.py",
           "found += int((pairs * (label[:, None] == got_label[None, :])).amax(1).sum())", "found += int(pairs.diagonal().sum())",
           (f"{EXPORT_EVERY}::test_panoptic_agreement_pairs_segments_whatever_their_numbers",)),
    Mutant("export every config: a failed agreement passes", "scripts/export_every_config.py",
           "        if network_difference > TOLERANCE:", "        if network_difference > 10:",
           (f"{EXPORT_EVERY}::test_a_config_whose_onnx_outputs_disagree_fails_unless_its_network_outputs_agree",)),
    Mutant("export every config: a disagreement is never checked on the network", "scripts/export_every_config.py",
           "    if agreement < AGREEMENT:  # near-ties", "    if agreement < 0:  # near-ties",
           (f"{EXPORT_EVERY}::test_a_config_whose_onnx_outputs_disagree_fails_unless_its_network_outputs_agree",)),
]


def copy_checkout(destination: Path) -> None:
    """Tracked and untracked, not ignored, files of the checkout into ``destination``."""
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout.split("\0")
    for name in filter(None, files):
        source = ROOT / name
        if source.is_file():
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, destination / name)


def run_tests(checkout: Path, tests: tuple[str, ...], timeout: float) -> tuple[bool, str]:
    """Whether the tests pass in ``checkout``, and pytest's last line."""
    env = dict(os.environ, PYTHONPATH=str(checkout), CI="true", OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    # the copy sits elsewhere, so point it at this checkout's ../shared/data
    env.setdefault("VISION_TX_SHARED_DATA", str(ROOT.parent / "shared" / "data"))
    # -n 0: a few tests each, run in --jobs copies at once; pytest-xdist's workers would only add their start-up
    command = [sys.executable, "-m", "pytest", "-q", "-x", "-n", "0", "-p", "no:cacheprovider", *tests]
    try:
        result = subprocess.run(command, cwd=checkout, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return False, f"timed out after {timeout:.0f}s"
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    return result.returncode == 0, lines[-1] if lines else result.stderr.strip()[-200:]


def run_mutant(checkout: Path, mutant: Mutant, timeout: float) -> tuple[str, str]:
    """Plants ``mutant`` in ``checkout``, runs its tests, restores the file: (result, pytest's summary)."""
    path = checkout / mutant.path
    original = path.read_text()
    if original.count(mutant.before) != 1:
        return "STALE", f"the line is not in {mutant.path} exactly once: update the mutant"
    path.write_text(original.replace(mutant.before, mutant.after))
    try:
        passed, summary = run_tests(checkout, mutant.tests, timeout)
    finally:
        path.write_text(original)
    return ("SURVIVED" if passed else "killed"), summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="", help="run the mutants whose name contains this text")
    parser.add_argument("--list", action="store_true", help="list the mutants and their tests, run nothing")
    parser.add_argument("--baseline", action="store_true", help="first check that the unmutated tests pass")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per mutant")
    parser.add_argument("--jobs", type=int, default=1, help="mutants run at once, each in its own copy of the checkout")
    parser.add_argument("--shard", default="1/1", help="K/N: every N-th mutant from the K-th (N processes, or machines, share the list)")
    parser.add_argument("--slice", default=":", help="A:B: the selection's (after --only and --shard) mutants A to B-1, to resume a run")
    args = parser.parse_args()
    shard, shards = (int(n) for n in args.shard.split("/"))
    if not 1 <= shard <= shards:
        parser.error(f"--shard {args.shard}: K/N with 1 <= K <= N")
    start, _, stop = args.slice.partition(":")
    mutants = [m for m in MUTANTS if args.only in m.name][shard - 1::shards][int(start or 0):int(stop) if stop else None]
    if args.list:
        for mutant in mutants:
            print(f"{mutant.name:50s} {mutant.path}  ->  {' '.join(mutant.tests)}")
        return 0
    with tempfile.TemporaryDirectory(prefix="vision_tx_mutants_") as tmp:
        checkouts = [Path(tmp) / str(job) for job in range(max(1, args.jobs))]
        for checkout in checkouts:
            copy_checkout(checkout)
        if args.baseline:
            tests = tuple(dict.fromkeys(t for m in mutants for t in m.tests))
            passed, summary = run_tests(checkouts[0], tests, args.timeout * len(tests))
            print(f"baseline: {'pass' if passed else 'FAIL'} ({summary})", flush=True)
            if not passed:
                return 2
        free = queue.SimpleQueue()
        for checkout in checkouts:
            free.put(checkout)

        def run_on_a_free_checkout(mutant: Mutant) -> tuple[str, str, float]:
            checkout = free.get()
            start = time.perf_counter()
            try:
                result, summary = run_mutant(checkout, mutant, args.timeout)
            finally:
                free.put(checkout)
            print(f"{mutant.name:50s} {result:8s} {time.perf_counter() - start:7.0f}  {summary}", flush=True)
            return result, summary, time.perf_counter() - start

        print(f"{'mutant':50s} {'result':8s} {'seconds':>7s}  tests", flush=True)
        with ThreadPoolExecutor(max_workers=len(checkouts)) as pool:
            results = list(pool.map(run_on_a_free_checkout, mutants))
    survivors = [m.name for m, (result, _, _) in zip(mutants, results) if result != "killed"]
    print(f"\n{len(mutants) - len(survivors)} of {len(mutants)} killed" + (f"; survived or stale: {survivors}" if survivors else ""))
    return 1 if survivors else 0

if __name__ == "__main__":
    sys.exit(main())
