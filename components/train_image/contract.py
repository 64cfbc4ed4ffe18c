"""The image trainer's contract: its settings and the model folder it writes; other steps
import this module, never the trainer (nothing here imports TensorFlow).
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Iterable, Sequence

from components.common import preemption
from components.common.input_kinds import InputKindError, read_json_object
from components.common.storage import filesystem, is_remote
from components.common.written import check_settings, setting

MODEL_FILE = "model.keras"
SAVED_MODEL_DIR = "saved_model"
LABELS_FILE = "labels.json"
PREPROCESSING_FILE = "preprocessing.json"
HISTORY_FILE = "history.json"
# TF Serving calls serving_default (files' bytes); serving_pixels takes resized pixels.
SERVING_SIGNATURE = "serving_default"
BYTES_INPUT_NAME = "image_bytes"
LABEL_OUTPUT_NAME = "label"
PIXELS_SIGNATURE = "serving_pixels"
PRECISION_MODES = ("auto", "on", "off")

# DenseNet's preprocess_input ("torch" mode): (x / 255 - mean) / std per RGB channel.
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
# EfficientNet-Lite's: (x - 127) / 128.
LITE_INPUT_OFFSET = 127.0
LITE_INPUT_SCALE = 128.0


class ContractError(ValueError):
    """A folder is not what the trainer writes; the message says what is missing."""


def normalize_weights(weights: str | None) -> str | None:
    """Maps "none"/"" to None; leaves "imagenet" and file paths as they are."""
    if weights is None or str(weights).strip().lower() in ("", "none", "null"):
        return None
    return str(weights)


# The backbones, each with how many top blocks fine-tuning may unfreeze.
ARCHITECTURES = {"densenet121": 4, "efficientnet_lite0": 7}
# Dense blocks per stage (conv2 to conv5) of the layouts Keras names.
KERAS_LAYOUTS = {(6, 12, 24, 16): "DenseNet121", (6, 12, 32, 32): "DenseNet169",
                 (6, 12, 48, 32): "DenseNet201"}
DENSENET121 = (6, 12, 24, 16)
LITE0_STAGES = (1, 2, 2, 3, 3, 4, 1)  # MBConv blocks per stage of EfficientNet-Lite0


def dense_layout(names: Iterable[str]) -> tuple[int, ...]:
    """Dense blocks per stage (conv2 to conv5) of a DenseNet, from its layer names (or
    snapshot keys); ValueError if a stage has none."""
    blocks = [0, 0, 0, 0]
    for name in names:
        match = re.match(r"conv([2-5])_block(\d+)_", name)
        if match:
            stage = int(match.group(1)) - 2
            blocks[stage] = max(blocks[stage], int(match.group(2)))
    if 0 in blocks:
        raise ValueError("not a DenseNet: no dense blocks in stage conv"
                         f"{blocks.index(0) + 2} (layers named conv<stage>_block<n>_...)")
    return tuple(blocks)


def architecture_name(layout: Sequence[int]) -> str:
    """"DenseNet121", "DenseNet169", "DenseNet201", or e.g. "DenseNet(1-2-2-1)"."""
    return KERAS_LAYOUTS.get(tuple(layout), f"DenseNet({'-'.join(map(str, layout))})")


def network_name(names: Iterable[str]) -> str:
    """What network layer names (or snapshot keys) are: "DenseNet121" (`architecture_name`),
    "EfficientNet-Lite0", or a description of another EfficientNet; ValueError if neither."""
    names = list(names)
    blocks: dict[int, set[str]] = {}
    for name in names:
        if match := re.match(r"block(\d+)([a-z])_", name):
            blocks.setdefault(int(match.group(1)), set()).add(match.group(2))
    if not blocks:
        return architecture_name(dense_layout(names))
    stages = tuple(len(blocks.get(stage, ())) for stage in range(1, max(blocks) + 1))
    if any("_se_" in name for name in names):  # Keras' EfficientNetB0-B7
        return f"an EfficientNet with squeeze-excitation, blocks per stage {stages}"
    if stages == LITE0_STAGES:
        return "EfficientNet-Lite0"
    return f"an EfficientNet-Lite of blocks per stage {stages} (Lite0 has {LITE0_STAGES})"


def weights_file_layout(path: str, architecture: str = "densenet121") -> tuple[int, ...] | None:
    """Checks a local no-top tf-keras HDF5 weights file against `architecture`: the
    trainer's check (`weights_problem` the preflight's).

    Returns:
        A DenseNet's dense blocks per stage; None for EfficientNet-Lite0.

    Raises:
        ValueError: No such weights file, or another network's (naming both).
    """
    import h5py

    if not os.path.isfile(path):
        raise ValueError(
            f"weights {path!r} is neither 'imagenet', 'none' nor an existing file: give "
            f"'imagenet' ({architecture}'s ImageNet weights), 'none' (train from scratch) or "
            f"the path of a no-top .h5 weights file of {architecture} (local, gs:// or s3://)")
    expected = ("the no-top weights of a tf-keras DenseNet (.h5, e.g. Keras' "
                "densenet121_weights_tf_dim_ordering_tf_kernels_notop.h5)"
                if architecture == "densenet121" else
                "the no-top weights of EfficientNet-Lite0 (.h5, as `make models` converts them)")
    try:
        with h5py.File(path, "r") as f:
            names = f.attrs.get("layer_names", [])
            if isinstance(names, (str, bytes)) or not hasattr(names, "__iter__"):
                raise ValueError(f"its layer_names attribute is {names!r}, not a list of "
                                 "layer names")
            names = [n.decode() if isinstance(n, bytes) else str(n) for n in names]
        held = network_name(names)
    except (OSError, ValueError) as err:
        raise ValueError(f"weights file {path!r} is not {expected}: {err}") from err
    if architecture == "densenet121" and held.startswith("DenseNet"):
        return dense_layout(names)
    if architecture == "efficientnet_lite0" and held == "EfficientNet-Lite0":
        return None
    raise ValueError(f"weights file {path!r} holds {held}, and architecture={architecture!r} "
                     f"expects {expected}: give architecture the file's network or another file")


def weights_problem(weights: str | None, architecture: str = "densenet121") -> str:
    """What the trainer would refuse in `weights` (`weights_file_layout`), late, after
    sharding; "" when it is "imagenet", "none", a remote file (not read here) or a local
    weights file of `architecture` (an unknown one is refused as a setting)."""
    value = normalize_weights(weights)
    if value in (None, "imagenet") or is_remote(value) or architecture not in ARCHITECTURES:
        return ""
    try:
        weights_file_layout(value, architecture)
    except ValueError as err:
        return str(err)
    return ""


class TrainingError(ValueError):
    """The training cannot run as asked; the message says what to change."""


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """How to train: each field's help is the training step's input help (the console's),
    where a step input's 0 stands for None (`components.common.written.as_step_value`)."""

    epochs: int = setting(10, "Epochs training only the new top on the frozen pretrained "
                          "base (from scratch: epochs + fine_tune_epochs of full training).", ge=0)
    fine_tune_epochs: int = setting(10, "Epochs fine-tuning the top dense blocks after the "
                                    "head phase, at fine_tune_learning_rate.", ge=0)
    batch_size: int = setting(32, "Examples per replica (GPU) per step; the global batch is "
                              "this times the number of replicas.", ge=1)
    learning_rate: float = setting(1e-3, "Adam learning rate of the head phase for one "
                                   "replica; scaled linearly with the replicas.", gt=0)
    fine_tune_learning_rate: float = setting(1e-4, "Adam learning rate of the fine-tune phase "
                                             "for one replica; scaled linearly with the "
                                             "replicas.", gt=0)
    architecture: str = setting("densenet121", 'The backbone: "densenet121" (with a weights '
                                "file, the DenseNet it holds: 121, 169, 201 or another "
                                'layout) or "efficientnet_lite0" (EfficientNet-Lite0, about a '
                                "seventh of DenseNet121's FLOPs).", choices=tuple(ARCHITECTURES))
    unfreeze_blocks: int = setting(1, "Top blocks trained in fine-tuning: DenseNet's dense "
                                   "blocks (1-4) or EfficientNet-Lite0's MBConv stages (1-7, "
                                   "with its head conv); BatchNorm layers stay frozen.", ge=1)
    dropout: float = setting(0.2, "Dropout rate before the classification layer.", ge=0, lt=1)
    weights: str | None = setting("imagenet", 'Base weights: "imagenet" (DenseNet121\'s, '
                                  "downloaded by Keras; EfficientNet-Lite0's, converted when "
                                  'the image was built, no download), "none" (from scratch), '
                                  "or the URI (gs:// or local) of a no-top .h5 weights file "
                                  "of the architecture (a DenseNet's layout is read from the "
                                  "file).")
    flip: bool = setting(True, "Random horizontal flips of training images.")
    rotation: float = setting(0.05, "Random rotation of training images as a fraction of a "
                              "full turn (0.05 = up to 18 degrees); 0 turns it off.", ge=0, lt=0.5)
    zoom: float = setting(0.1, "Random zoom of training images by a factor in [1 - zoom, "
                          "1 + zoom]; 0 turns it off.", ge=0, lt=1)
    precision: str = setting("auto", '"auto" (mixed_float16 when every GPU has compute '
                             'capability 7.0+), "on" or "off" (float32).', choices=PRECISION_MODES)
    seed: int = setting(42, "Seed of initialisation, shuffling and augmentation.")
    early_stopping_patience: int = setting(3, "Epochs without validation-loss improvement "
                                           "before a phase stops, keeping its best weights; "
                                           "0 turns it off.", ge=0)
    reduce_lr_patience: int = setting(2, "Epochs without validation-loss improvement before "
                                      "the learning rate is cut 5x; 0 turns it off.", ge=0)
    reduce_lr_factor: float = setting(0.2, "What reduce_lr_patience multiplies the learning "
                                      "rate by.", gt=0, lt=1)
    shuffle_buffer: int = setting(2048, "Examples in the shuffle buffer (a 224px image takes "
                                  "150 KB of memory).", ge=1)
    steps_per_epoch: int | None = setting(None, "Training steps per epoch; 0 for one pass over "
                                          "the training split.", ge=1)
    validation_steps: int | None = setting(None, "Validation batches per evaluation; 0 for the "
                                           "whole split.", ge=1)
    checkpoint_every_steps: int = setting(0, preemption.EVERY_STEPS_HELP, ge=0)

    def __post_init__(self) -> None:
        problems = []
        if self.epochs + self.fine_tune_epochs < 1:
            problems.append("epochs + fine_tune_epochs must be at least 1, got "
                            f"{self.epochs} and {self.fine_tune_epochs}")
        most = ARCHITECTURES.get(self.architecture, self.unfreeze_blocks)
        if self.unfreeze_blocks > most:
            problems.append(f"unfreeze_blocks must be in 1..{most} for {self.architecture}, "
                            f"got {self.unfreeze_blocks}")
        check_settings(self, TrainingError, *problems)

    @property
    def pretrained(self) -> bool:
        return normalize_weights(self.weights) is not None


def load_class_names(model_dir: str) -> list[str]:
    """Reads the model's class names, in output-column order, from `<model_dir>/labels.json`.

    Raises:
        ContractError: The file is missing or has no list under "classes".
    """
    path = os.path.join(model_dir, LABELS_FILE)
    fs, path = filesystem(path)
    if not fs.exists(path):
        raise ContractError(f"{path} not found: {model_dir!r} is not a trained model folder "
                              f"(expected {MODEL_FILE} and {LABELS_FILE})")
    with fs.open(path, "rb") as f:
        try:
            classes = read_json_object(f.read(), f"model file {path!r}",
                                       "give the training step's model output, whole"
                                       ).get("classes")
        except InputKindError as err:
            raise ContractError(str(err)) from None
    if not isinstance(classes, list) or not classes:
        raise ContractError(f'{path} must hold {{"classes": [name, ...]}}')
    return [str(c) for c in classes]
