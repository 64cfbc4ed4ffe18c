"""KFP faces of the preflight step: each pipeline's parameters handed to `checks.run_preflight`.

Each parameter list is its pipeline's, written here by `python -m tools.signatures`
(a test fails when it is stale): they arrive typed, one input each, which every backend
resolves the same way. Each body takes its inputs (`locals()`) first, then imports the
one function it calls: KFP pastes only the function's source into the compiled pipeline.
"""

from typing import NamedTuple


# Parameters written by python -m tools.signatures from image_pipeline (edit there).
def preflight_image(
    data_uri: str,
    image_size: int = 224,
    image_format: str = "jpeg",
    jpeg_quality: int = 95,
    resize_method: str = "crop",
    train_fraction: float = 0.8,
    validation_fraction: float = 0.1,
    test_fraction: float = 0.1,
    seed: int = 42,
    target_shard_mb: float = 100.0,
    min_shards_per_split: int = 16,
    max_skipped_fraction: float = 0.05,
    shard_workers: int = 0,
    weights: str = "imagenet",
    epochs: int = 10,
    fine_tune_epochs: int = 10,
    batch_size: int = 32,
    learning_rate: float = 1e-3,
    fine_tune_learning_rate: float = 1e-4,
    unfreeze_blocks: int = 1,
    dropout: float = 0.2,
    flip: bool = True,
    rotation: float = 0.05,
    zoom: float = 0.1,
    precision: str = "auto",
    early_stopping_patience: int = 3,
    reduce_lr_patience: int = 2,
    steps_per_epoch: int = 0,
    eval_batch_size: int = 64,
    register_model: bool = True,
    registration_metric: str = "accuracy",
    registration_threshold: float = 0.8,
    registration_beats_baselines: bool = False,
    model_display_name: str = "densenet121-image-classifier",
    predict_uri: str = "",
    tracking_uri: str = "",
    job_service_account: str = "",
    tensorboard: str = "",
) -> NamedTuple("Outputs", [("data_fingerprint", str), ("weights_fingerprint", str),
                            ("predict_fingerprint", str)]):
    """Refuses image pipeline settings that a later step would refuse, before any paid job
    starts, and fingerprints the input folder, the weights file and the folder to label.
    Never cached: each fingerprint is an input of the step that reads those files, so its
    cache key changes exactly when they change.

    Args:
        data_uri: See the pipeline. Every other parameter but tensorboard is the pipeline's, checked by the step that uses it.
        tensorboard: Not a pipeline parameter: the TensorBoard the training jobs upload to, set at compile time (compile.py --tensorboard); with one, an empty job_service_account is refused (Vertex would refuse the training job).

    Returns:
        data_fingerprint: "sha256:<digest>:<files>", a digest of the input's listing (names, sizes, versions).
        weights_fingerprint: The same of a weights file; empty for imagenet or none.
        predict_fingerprint: The same of predict_uri; empty when nothing is to be labelled.
    """
    parameters = dict(locals())  # the step's inputs, before the import names one more
    from components.preflight.checks import run_preflight

    return run_preflight("image", parameters)


# Parameters written by python -m tools.signatures from text_pipeline (edit there).
def preflight_text(
    data_uri: str,
    lm_assets: str = "",
    lang: str = "en",
    pretrained: bool = True,
    text_column: str = "text",
    label_columns: str = "",
    label_delimiter: str = "auto",
    other_label: str = "other",
    validation_fraction: float = 0.2,
    test_fraction: float = 0.25,
    seed: int = 42,
    lm_epochs: int = 4,
    epochs: int = 12,
    batch_size: int = 16,
    drop_mult: float = 0.3,
    backwards: bool = False,
    threshold: float = 0.3,
    monitor: str = "f1_score",
    unfreeze: str = "auto",
    learning_rate: float = 0.0,
    lm_learning_rate: float = 0.002,
    seq_len: int = 72,
    min_freq: int = 3,
    max_vocab: int = 60000,
    mixed_precision: bool = True,
    model_config: str = "",
    eval_split: str = "test",
    eval_batch_size: int = 64,
    register_model: bool = True,
    registration_metric: str = "micro_f1",
    registration_threshold: float = 0.5,
    registration_beats_baselines: bool = False,
    model_display_name: str = "ulmfit-text-classifier",
    predict_uri: str = "",
    tracking_uri: str = "",
    job_service_account: str = "",
    tensorboard: str = "",
) -> NamedTuple("Outputs", [("data_fingerprint", str), ("lm_assets_fingerprint", str),
                            ("predict_fingerprint", str)]):
    """Refuses text pipeline settings that a later step would refuse (and a missing
    pretrained language model), before any paid job starts, and fingerprints the CSV, the
    pretrained language models and the CSV to label. Never cached: each fingerprint is an
    input of the step that reads those files.

    Args:
        data_uri: See the pipeline. Every other parameter but tensorboard is the pipeline's, checked by the step that uses it.
        tensorboard: Not a pipeline parameter: the TensorBoard the training jobs upload to, set at compile time (compile.py --tensorboard); with one, an empty job_service_account is refused (Vertex would refuse the training job).

    Returns:
        data_fingerprint: "sha256:<digest>:<files>", a digest of the input's listing (name, size, version).
        lm_assets_fingerprint: The same of lm_assets when pretrained; else empty.
        predict_fingerprint: The same of predict_uri; empty when nothing is to be labelled.
    """
    parameters = dict(locals())  # the step's inputs, before the import names one more
    from components.preflight.checks import run_preflight

    return run_preflight("text", parameters)


# Parameters written by python -m tools.signatures from transformer_pipeline (edit there).
def preflight_transformer(
    data_uri: str,
    text_column: str = "text",
    label_columns: str = "",
    label_delimiter: str = "auto",
    other_label: str = "other",
    validation_fraction: float = 0.2,
    test_fraction: float = 0.25,
    seed: int = 42,
    model_name: str = "FacebookAI/xlm-roberta-base",
    epochs: int = 6,
    batch_size: int = 16,
    learning_rate: float = 5e-05,
    weight_decay: float = 0.01,
    warmup_ratio: float = 0.1,
    max_length: int = 256,
    threshold: float = 0.5,
    monitor: str = "loss",
    early_stopping_patience: int = 2,
    mixed_precision: bool = True,
    eval_split: str = "test",
    eval_batch_size: int = 64,
    register_model: bool = True,
    registration_metric: str = "micro_f1",
    registration_threshold: float = 0.5,
    registration_beats_baselines: bool = False,
    model_display_name: str = "transformer-text-classifier",
    predict_uri: str = "",
    tracking_uri: str = "",
    job_service_account: str = "",
    tensorboard: str = "",
) -> NamedTuple("Outputs", [("data_fingerprint", str), ("model_fingerprint", str),
                            ("predict_fingerprint", str)]):
    """Refuses transformer pipeline settings that a later step would refuse (and a
    model_name folder without a model in it), before any paid job starts, and fingerprints
    the CSV, the model_name folder and the CSV to label. Never cached: each fingerprint is
    an input of the step that reads those files.

    Args:
        data_uri: See the pipeline. Every other parameter but tensorboard is the pipeline's, checked by the step that uses it.
        tensorboard: Not a pipeline parameter: the TensorBoard the training jobs upload to, set at compile time (compile.py --tensorboard); with one, an empty job_service_account is refused (Vertex would refuse the training job).

    Returns:
        data_fingerprint: "sha256:<digest>:<files>", a digest of the input's listing (name, size, version).
        model_fingerprint: The same of model_name when it is a folder (gs:// or local); empty for a Hub name.
        predict_fingerprint: The same of predict_uri; empty when nothing is to be labelled.
    """
    parameters = dict(locals())  # the step's inputs, before the import names one more
    from components.preflight.checks import run_preflight

    return run_preflight("transformer", parameters)


# Parameters written by python -m tools.signatures from lm_pipeline (edit there).
def preflight_lm(
    corpus_uri: str,
    lang: str = "en",
    text_column: str = "text",
    backwards: bool = False,
    epochs: int = 10,
    batch_size: int = 64,
    seq_len: int = 72,
    learning_rate: float = 0.01,
    drop_mult: float = 0.3,
    min_freq: int = 3,
    max_vocab: int = 60000,
    spm_vocab_size: int = 0,
    validation_fraction: float = 0.1,
    mixed_precision: bool = True,
    model_config: str = "",
    seed: int = 42,
    tracking_uri: str = "",
    job_service_account: str = "",
    tensorboard: str = "",
) -> str:
    """Refuses language model pipeline settings and a corpus the training step would
    refuse, before the GPU job starts, and fingerprints the corpus. Never cached.

    Args:
        corpus_uri: See the pipeline. Every other parameter but tensorboard is the pipeline's, checked by the step that uses it.
        tensorboard: Not a pipeline parameter: the TensorBoard the training jobs upload to, set at compile time (compile.py --tensorboard); with one, an empty job_service_account is refused (Vertex would refuse the training job).

    Returns:
        "sha256:<digest>:<files>", a digest of the corpus listing (name, size, version).
    """
    parameters = dict(locals())  # the step's inputs, before the import names one more
    from components.preflight.checks import run_preflight

    return run_preflight("lm", parameters)
