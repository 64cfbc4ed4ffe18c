"""KFP face of the image trainer: `train_image_classifier` takes every field of
`contract.TrainConfig` (its type, default and help, written from the class by
`components.common.written.step_function`) between its artifacts and its run inputs."""

from kfp.dsl import Dataset, Input, Metrics, Model, Output

from components.common.written import settings_from_step, step_function
from components.train_image.contract import TrainConfig


def train_step(values: dict) -> None:
    """The step's work on its inputs (`values`, by name): trains, logs metrics, tags the model."""
    from components.train_image.artifact import model_metadata
    from components.train_image.training import resolve_dirs, train

    config = settings_from_step(TrainConfig, values)
    model, metrics = values["model"], values["metrics"]
    checkpoints, tensorboard = resolve_dirs(model.path, values["checkpoint_dir"],
                                            values["tensorboard_dir"])
    result = train(values["dataset"].path, model.path, config, checkpoints, tensorboard,
                   hypertune_metric=values["hypertune_metric"] or None)
    for name, value in result.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            metrics.log_metric(name, float(value))
    model.metadata.update(model_metadata(result, config, values["dataset"].path,
                                         values["weights_fingerprint"]))


def written_step(settings: type = TrainConfig):
    """`train_image_classifier` written from `settings` (a test writes it from another)."""
    return step_function(
        "train_image_classifier", settings,
        "Trains a DenseNet or EfficientNet-Lite0 image classifier (tf-keras) on sharded "
        "TFRecords.",
        before=[
            ("dataset", Input[Dataset], "Output of the sharding step: TFRecord shards and "
             "manifest.json."),
            ("model", Output[Model], 'Output folder: model.keras, saved_model/ (serving_default: '
             '"image_bytes" encoded image files, decoded and resized as sharding did -> '
             '"probabilities", "label"; serving_pixels: "image" float32 RGB 0..255 -> '
             '"probabilities"), labels.json, preprocessing.json, history.json, and tensorboard/ '
             "unless tensorboard_dir or $AIP_TENSORBOARD_LOG_DIR is set."),
            ("metrics", Output[Metrics], "Final metrics: train/validation loss and accuracy, "
             "epochs run, replicas."),
        ],
        after=[
            ("weights_fingerprint", "", "Digest of the weights file's listing from the preflight "
             "step; not read, it only makes the cache key change when the file does. Recorded in "
             "the model metadata."),
            ("checkpoint_dir", "", "Folder (gs:// or local) of the resume checkpoints, shared by "
             "all workers; empty: $AIP_CHECKPOINT_DIR, else inside the model folder. Deleted when "
             "training ends."),
            ("tensorboard_dir", "", "Folder of TensorBoard logs; empty: $AIP_TENSORBOARD_LOG_DIR, "
             "else model/tensorboard."),
            ("hypertune_metric", "", "Set by the trials of a Vertex tuning job: the epoch value "
             "(e.g. val_accuracy) reported to the tuning service after each epoch; empty reports "
             "nothing."),
        ],
        runs="components.train_image.component:train_step", leave_out=("reduce_lr_factor",))


train_image_classifier = written_step()

