"""KFP faces of tuning: the trials Kubeflow runs, and the best trial's values unpacked into
the retraining step's inputs.

Each kind's best-trial (Vertex) and selection (Kubeflow) step takes and returns every
parameter of `contract.TUNABLE[kind]` (the best trial's value where the study searched it,
the run's value otherwise), so the retraining step takes them the way it takes pipeline
parameters. A trial step takes the trainer's inputs and the trial's point. Their parameter
lists are written by `python -m tools.signatures` (a test fails when one is stale).
"""

from typing import NamedTuple

from kfp.dsl import Artifact, Dataset, Input, Metrics, Model, Output


# Tunable inputs and outputs written by python -m tools.signatures from contract.TUNABLE
# (edit there).
def best_image_trial(
    gcp_resources: str,
    trials: Output[Artifact],
    learning_rate: float,
    fine_tune_learning_rate: float,
    dropout: float,
    batch_size: int,
    unfreeze_blocks: int,
) -> NamedTuple("BestImageTrial", [("learning_rate", float), ("fine_tune_learning_rate", float),
                                   ("dropout", float), ("batch_size", int),
                                   ("unfreeze_blocks", int)]):
    """Reads the finished tuning job and returns the best trial's values for the image trainer.

    Args:
        gcp_resources: The tuning step's output: which HyperparameterTuningJob ran.
        trials: Output file trials.json: every trial's id, state, parameters and metric, the study's metric and goal, and the best trial.
        learning_rate: The run's value, kept when the study did not search it.
        fine_tune_learning_rate: The run's value, kept when the study did not search it.
        dropout: The run's value, kept when the study did not search it.
        batch_size: The run's value, kept when the study did not search it.
        unfreeze_blocks: The run's value, kept when the study did not search it.
    """
    from components.tune.selection import choose

    return tuple(choose("image", gcp_resources, locals(), trials).values())


# Tunable inputs and outputs written by python -m tools.signatures from contract.TUNABLE
# (edit there).
def best_text_trial(
    gcp_resources: str,
    trials: Output[Artifact],
    learning_rate: float,
    lm_learning_rate: float,
    drop_mult: float,
    batch_size: int,
) -> NamedTuple("BestTextTrial", [("learning_rate", float), ("lm_learning_rate", float),
                                  ("drop_mult", float), ("batch_size", int)]):
    """Reads the finished tuning job and returns the best trial's values for the text trainer.

    Args:
        gcp_resources: The tuning step's output: which HyperparameterTuningJob ran.
        trials: Output file trials.json: every trial's id, state, parameters and metric, the study's metric and goal, and the best trial.
        learning_rate: The run's value, kept when the study did not search it.
        lm_learning_rate: The run's value, kept when the study did not search it.
        drop_mult: The run's value, kept when the study did not search it.
        batch_size: The run's value, kept when the study did not search it.
    """
    from components.tune.selection import choose

    return tuple(choose("text", gcp_resources, locals(), trials).values())


# Tunable inputs and outputs written by python -m tools.signatures from contract.TUNABLE
# (edit there).
def best_transformer_trial(
    gcp_resources: str,
    trials: Output[Artifact],
    learning_rate: float,
    batch_size: int,
    warmup_ratio: float,
    weight_decay: float,
) -> NamedTuple("BestTransformerTrial", [("learning_rate", float), ("batch_size", int),
                                         ("warmup_ratio", float), ("weight_decay", float)]):
    """Reads the finished tuning job and returns the best trial's values for the transformer trainer.

    Args:
        gcp_resources: The tuning step's output: which HyperparameterTuningJob ran.
        trials: Output file trials.json: every trial's id, state, parameters and metric, the study's metric and goal, and the best trial.
        learning_rate: The run's value, kept when the study did not search it.
        batch_size: The run's value, kept when the study did not search it.
        warmup_ratio: The run's value, kept when the study did not search it.
        weight_decay: The run's value, kept when the study did not search it.
    """
    from components.tune.selection import choose

    return tuple(choose("transformer", gcp_resources, locals(), trials).values())


# The Kubeflow target's search: its trials ran as tasks of the pipeline (the trial steps
# below), their results collected from the loop.
# Tunable inputs and outputs written by python -m tools.signatures from contract.TUNABLE
# (edit there).
def select_image_trial(
    results: list[dict],
    goal: str,
    max_failed_trials: int,
    trials: Output[Artifact],
    learning_rate: float,
    fine_tune_learning_rate: float,
    dropout: float,
    batch_size: int,
    unfreeze_blocks: int,
) -> NamedTuple("BestImageTrial", [("learning_rate", float), ("fine_tune_learning_rate", float),
                                   ("dropout", float), ("batch_size", int),
                                   ("unfreeze_blocks", int)]):
    """Ranks the image trials the pipeline ran and returns the best trial's values.

    Args:
        results: Every trial's result (state, values, the study metric's best epoch value, error).
        goal: "maximize" or "minimize" the study metric.
        max_failed_trials: Failed trials that fail the search; 0 fails it only when no trial succeeded.
        trials: Output file trials.json: every trial's values, state, metric and error, and the best trial.
        learning_rate: The run's value, kept when the study did not search it.
        fine_tune_learning_rate: The run's value, kept when the study did not search it.
        dropout: The run's value, kept when the study did not search it.
        batch_size: The run's value, kept when the study did not search it.
        unfreeze_blocks: The run's value, kept when the study did not search it.
    """
    from components.tune.selection import choose_from_results

    return tuple(choose_from_results("image", results, goal, max_failed_trials, locals(),
                                     trials).values())


# Tunable inputs and outputs written by python -m tools.signatures from contract.TUNABLE
# (edit there).
def select_text_trial(
    results: list[dict],
    goal: str,
    max_failed_trials: int,
    trials: Output[Artifact],
    learning_rate: float,
    lm_learning_rate: float,
    drop_mult: float,
    batch_size: int,
) -> NamedTuple("BestTextTrial", [("learning_rate", float), ("lm_learning_rate", float),
                                  ("drop_mult", float), ("batch_size", int)]):
    """Ranks the text trials the pipeline ran and returns the best trial's values.

    Args:
        results: Every trial's result (state, values, the study metric's best epoch value, error).
        goal: "maximize" or "minimize" the study metric.
        max_failed_trials: Failed trials that fail the search; 0 fails it only when no trial succeeded.
        trials: Output file trials.json: every trial's values, state, metric and error, and the best trial.
        learning_rate: The run's value, kept when the study did not search it.
        lm_learning_rate: The run's value, kept when the study did not search it.
        drop_mult: The run's value, kept when the study did not search it.
        batch_size: The run's value, kept when the study did not search it.
    """
    from components.tune.selection import choose_from_results

    return tuple(choose_from_results("text", results, goal, max_failed_trials, locals(),
                                     trials).values())


# Tunable inputs and outputs written by python -m tools.signatures from contract.TUNABLE
# (edit there).
def select_transformer_trial(
    results: list[dict],
    goal: str,
    max_failed_trials: int,
    trials: Output[Artifact],
    learning_rate: float,
    batch_size: int,
    warmup_ratio: float,
    weight_decay: float,
) -> NamedTuple("BestTransformerTrial", [("learning_rate", float), ("batch_size", int),
                                         ("warmup_ratio", float), ("weight_decay", float)]):
    """Ranks the transformer trials the pipeline ran and returns the best trial's values.

    Args:
        results: Every trial's result (state, values, the study metric's best epoch value, error).
        goal: "maximize" or "minimize" the study metric.
        max_failed_trials: Failed trials that fail the search; 0 fails it only when no trial succeeded.
        trials: Output file trials.json: every trial's values, state, metric and error, and the best trial.
        learning_rate: The run's value, kept when the study did not search it.
        batch_size: The run's value, kept when the study did not search it.
        warmup_ratio: The run's value, kept when the study did not search it.
        weight_decay: The run's value, kept when the study did not search it.
    """
    from components.tune.selection import choose_from_results

    return tuple(choose_from_results("transformer", results, goal, max_failed_trials, locals(),
                                     trials).values())


# The Kubeflow target's trials: one task per point in a ParallelFor, each its trainer's code
# with the point's values (components.tune.task_trial).

# Parameters written by python -m tools.signatures from train_image_classifier (edit there).
def trial_train_image_classifier(
    trial_point: dict,
    study_metric: str,
    study_goal: str,
    dataset: Input[Dataset],
    model: Output[Model],
    metrics: Output[Metrics],
    epochs: int = 10,
    fine_tune_epochs: int = 10,
    batch_size: int = 32,
    learning_rate: float = 1e-3,
    fine_tune_learning_rate: float = 1e-4,
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
) -> dict:
    """Trains the image classifier with the point's values (its other inputs are the
    trainer's) and returns the study metric; a failed training is a FAILED result.

    Args:
        trial_point: The trial's values of tunable parameters and its number ("trial").
        study_metric: The epoch value the study ranks trials by.
        study_goal: "maximize" or "minimize" the study metric.
    """
    inputs = dict(locals())  # the step's inputs, before the import names one more
    from components.tune.task_trial import run_step

    return run_step("image", inputs)


# Parameters written by python -m tools.signatures from train_text_classifier (edit there).
def trial_train_text_classifier(
    trial_point: dict,
    study_metric: str,
    study_goal: str,
    dataset: Input[Dataset],
    model: Output[Model],
    metrics: Output[Metrics],
    lm_assets_uri: str = "",
    lm_assets_fingerprint: str = "",
    lang: str = "en",
    pretrained: bool = True,
    backwards: bool = False,
    lm_epochs: int = 4,
    epochs: int = 12,
    batch_size: int = 16,
    drop_mult: float = 0.3,
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
    seed: int = 42,
    tensorboard_dir: str = "",
    hypertune_metric: str = "",
) -> dict:
    """Trains the text classifier with the point's values (its other inputs are the
    trainer's) and returns the study metric; a failed training is a FAILED result.

    Args:
        trial_point: The trial's values of tunable parameters and its number ("trial").
        study_metric: The epoch value the study ranks trials by.
        study_goal: "maximize" or "minimize" the study metric.
    """
    inputs = dict(locals())  # the step's inputs, before the import names one more
    from components.tune.task_trial import run_step

    return run_step("text", inputs)


# Parameters written by python -m tools.signatures from train_transformer_classifier (edit there).
def trial_train_transformer_classifier(
    trial_point: dict,
    study_metric: str,
    study_goal: str,
    dataset: Input[Dataset],
    model: Output[Model],
    metrics: Output[Metrics],
    model_name: str = "FacebookAI/xlm-roberta-base",
    model_fingerprint: str = "",
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
    seed: int = 42,
    tensorboard_dir: str = "",
    hypertune_metric: str = "",
) -> dict:
    """Trains the transformer classifier with the point's values (its other inputs are the
    trainer's) and returns the study metric; a failed training is a FAILED result.

    Args:
        trial_point: The trial's values of tunable parameters and its number ("trial").
        study_metric: The epoch value the study ranks trials by.
        study_goal: "maximize" or "minimize" the study metric.
    """
    inputs = dict(locals())  # the step's inputs, before the import names one more
    from components.tune.task_trial import run_step

    return run_step("transformer", inputs)


BEST_TRIAL = {"image": best_image_trial, "text": best_text_trial,
              "transformer": best_transformer_trial}
SELECT_TRIAL = {"image": select_image_trial, "text": select_text_trial,
                "transformer": select_transformer_trial}
TRIAL = {"image": trial_train_image_classifier, "text": trial_train_text_classifier,
         "transformer": trial_train_transformer_classifier}
