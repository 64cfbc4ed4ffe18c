"""KFP face of the DenseNet trainer: the typed signature mapped onto `training.train`."""

from kfp.dsl import Dataset, Input, Metrics, Model, Output


# Defaults written by python -m tools.signatures from contract.TrainConfig (edit there).
def train_image_classifier(
    dataset: Input[Dataset],
    model: Output[Model],
    metrics: Output[Metrics],
    epochs: int = 10,
    fine_tune_epochs: int = 10,
    batch_size: int = 32,
    learning_rate: float = 1e-3,
    fine_tune_learning_rate: float = 1e-4,
    architecture: str = "densenet121",
    unfreeze_blocks: int = 1,
    dropout: float = 0.2,
    weights: str = "imagenet",
    weights_fingerprint: str = "",
    flip: bool = True,
    rotation: float = 0.05,
    zoom: float = 0.1,
    precision: str = "auto",
    seed: int = 42,
    early_stopping_patience: int = 3,
    reduce_lr_patience: int = 2,
    shuffle_buffer: int = 2048,
    steps_per_epoch: int = 0,
    validation_steps: int = 0,
    checkpoint_dir: str = "",
    tensorboard_dir: str = "",
    hypertune_metric: str = "",
):
    """Trains a DenseNet or EfficientNet-Lite0 image classifier (tf-keras) on sharded TFRecords.

    Args:
        dataset: Output of the sharding step: TFRecord shards and manifest.json.
        model: Output folder: model.keras, saved_model/ (serving_default: "image_bytes" encoded image files, decoded and resized as sharding did -> "probabilities", "label"; serving_pixels: "image" float32 RGB 0..255 -> "probabilities"), labels.json, preprocessing.json, history.json, and tensorboard/ unless tensorboard_dir or $AIP_TENSORBOARD_LOG_DIR is set.
        metrics: Final metrics: train/validation loss and accuracy, epochs run, replicas.
        epochs: Epochs training only the new top on the frozen pretrained base (from scratch: epochs + fine_tune_epochs of full training).
        fine_tune_epochs: Epochs fine-tuning the top dense blocks after the head phase, at fine_tune_learning_rate.
        batch_size: Examples per replica (GPU) per step; the global batch is this times the number of replicas.
        learning_rate: Adam learning rate of the head phase for one replica; scaled linearly with the replicas.
        fine_tune_learning_rate: Adam learning rate of the fine-tune phase for one replica; scaled linearly with the replicas.
        architecture: The backbone: "densenet121" (with a weights file, the DenseNet it holds: 121, 169, 201 or another layout) or "efficientnet_lite0" (EfficientNet-Lite0, about a seventh of DenseNet121's FLOPs).
        unfreeze_blocks: Top blocks trained in fine-tuning: DenseNet's dense blocks (1-4) or EfficientNet-Lite0's MBConv stages (1-7, with its head conv); BatchNorm layers stay frozen.
        dropout: Dropout rate before the classification layer.
        weights: Base weights: "imagenet" (DenseNet121's, downloaded by Keras; EfficientNet-Lite0's, converted when the image was built, no download), "none" (from scratch), or the URI (gs:// or local) of a no-top .h5 weights file of the architecture (a DenseNet's layout is read from the file).
        weights_fingerprint: Digest of the weights file's listing from the preflight step; not read, it only makes the cache key change when the file does. Recorded in the model metadata.
        flip: Random horizontal flips of training images.
        rotation: Random rotation of training images as a fraction of a full turn (0.05 = up to 18 degrees); 0 turns it off.
        zoom: Random zoom of training images by a factor in [1 - zoom, 1 + zoom]; 0 turns it off.
        precision: "auto" (mixed_float16 when every GPU has compute capability 7.0+), "on" or "off" (float32).
        seed: Seed of initialisation, shuffling and augmentation.
        early_stopping_patience: Epochs without validation-loss improvement before a phase stops, keeping its best weights; 0 turns it off.
        reduce_lr_patience: Epochs without validation-loss improvement before the learning rate is cut 5x; 0 turns it off.
        shuffle_buffer: Examples in the shuffle buffer (a 224px image takes 150 KB of memory).
        steps_per_epoch: Training steps per epoch; 0 for one pass over the training split.
        validation_steps: Validation batches per evaluation; 0 for the whole split.
        checkpoint_dir: Folder (gs:// or local) of the resume checkpoints, shared by all workers; empty: $AIP_CHECKPOINT_DIR, else inside the model folder. Deleted when training ends.
        tensorboard_dir: Folder of TensorBoard logs; empty: $AIP_TENSORBOARD_LOG_DIR, else model/tensorboard.
        hypertune_metric: Set by the trials of a Vertex tuning job: the epoch value (e.g. val_accuracy) reported to the tuning service after each epoch; empty reports nothing.
    """
    from components.train_image.artifact import model_metadata
    from components.train_image.training import TrainConfig, resolve_dirs, train

    config = TrainConfig(
        epochs=epochs, fine_tune_epochs=fine_tune_epochs, batch_size=batch_size,
        learning_rate=learning_rate, fine_tune_learning_rate=fine_tune_learning_rate,
        architecture=architecture, unfreeze_blocks=unfreeze_blocks, dropout=dropout,
        weights=weights, flip=flip,
        rotation=rotation, zoom=zoom, precision=precision, seed=seed,
        early_stopping_patience=early_stopping_patience,
        reduce_lr_patience=reduce_lr_patience, shuffle_buffer=shuffle_buffer,
        steps_per_epoch=steps_per_epoch or None, validation_steps=validation_steps or None,
    )
    checkpoints, tensorboard = resolve_dirs(model.path, checkpoint_dir, tensorboard_dir)
    result = train(dataset.path, model.path, config, checkpoints, tensorboard,
                   hypertune_metric=hypertune_metric or None)
    for name, value in result.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            metrics.log_metric(name, float(value))
    model.metadata.update(model_metadata(result, config, dataset.path, weights_fingerprint))
