"""KFP faces of tuning: the best trial's values, unpacked into the retraining step's inputs.

Each kind's step returns every parameter of `contract.TUNABLE[kind]` (the best trial's
value where the study searched it, the run's value otherwise), so the retraining step
takes them the way it takes pipeline parameters.
"""

from typing import NamedTuple

from kfp.dsl import Artifact, Output


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
        learning_rate: The run's head learning rate, kept when the study did not search it.
        fine_tune_learning_rate: The run's fine-tune learning rate, kept when not searched.
        dropout: The run's dropout, kept when not searched.
        batch_size: The run's batch size, kept when not searched.
        unfreeze_blocks: The run's unfrozen blocks, kept when not searched.
    """
    from components.tune.selection import choose

    best = choose("image", gcp_resources, dict(
        learning_rate=learning_rate, fine_tune_learning_rate=fine_tune_learning_rate,
        dropout=dropout, batch_size=batch_size, unfreeze_blocks=unfreeze_blocks), trials)
    return (best["learning_rate"], best["fine_tune_learning_rate"], best["dropout"],
            best["batch_size"], best["unfreeze_blocks"])


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
        learning_rate: The run's classifier learning rate, kept when the study did not search it.
        lm_learning_rate: The run's language-model learning rate, kept when not searched.
        drop_mult: The run's dropout multiplier, kept when not searched.
        batch_size: The run's batch size, kept when not searched.
    """
    from components.tune.selection import choose

    best = choose("text", gcp_resources, dict(
        learning_rate=learning_rate, lm_learning_rate=lm_learning_rate, drop_mult=drop_mult,
        batch_size=batch_size), trials)
    return best["learning_rate"], best["lm_learning_rate"], best["drop_mult"], best["batch_size"]


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
        learning_rate: The run's peak learning rate, kept when the study did not search it.
        batch_size: The run's batch size, kept when not searched.
        warmup_ratio: The run's warmup share of the steps, kept when not searched.
        weight_decay: The run's AdamW weight decay, kept when not searched.
    """
    from components.tune.selection import choose

    best = choose("transformer", gcp_resources, dict(
        learning_rate=learning_rate, batch_size=batch_size, warmup_ratio=warmup_ratio,
        weight_decay=weight_decay), trials)
    return best["learning_rate"], best["batch_size"], best["warmup_ratio"], best["weight_decay"]


BEST_TRIAL = {"image": best_image_trial, "text": best_text_trial,
              "transformer": best_transformer_trial}


# The Kubeflow target's search: its trials ran as tasks of the pipeline
# (components.tune.task_trial), their results collected from the loop.
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
        learning_rate: The run's head learning rate, kept when the search did not vary it.
        fine_tune_learning_rate: The run's fine-tune learning rate, kept when not searched.
        dropout: The run's dropout, kept when not searched.
        batch_size: The run's batch size, kept when not searched.
        unfreeze_blocks: The run's unfrozen blocks, kept when not searched.
    """
    from components.tune.selection import choose_from_results

    best = choose_from_results("image", results, goal, max_failed_trials, dict(
        learning_rate=learning_rate, fine_tune_learning_rate=fine_tune_learning_rate,
        dropout=dropout, batch_size=batch_size, unfreeze_blocks=unfreeze_blocks), trials)
    return (best["learning_rate"], best["fine_tune_learning_rate"], best["dropout"],
            best["batch_size"], best["unfreeze_blocks"])


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
        learning_rate: The run's classifier learning rate, kept when the search did not vary it.
        lm_learning_rate: The run's language-model learning rate, kept when not searched.
        drop_mult: The run's dropout multiplier, kept when not searched.
        batch_size: The run's batch size, kept when not searched.
    """
    from components.tune.selection import choose_from_results

    best = choose_from_results("text", results, goal, max_failed_trials, dict(
        learning_rate=learning_rate, lm_learning_rate=lm_learning_rate, drop_mult=drop_mult,
        batch_size=batch_size), trials)
    return best["learning_rate"], best["lm_learning_rate"], best["drop_mult"], best["batch_size"]


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
        learning_rate: The run's peak learning rate, kept when the search did not vary it.
        batch_size: The run's batch size, kept when not searched.
        warmup_ratio: The run's warmup share of the steps, kept when not searched.
        weight_decay: The run's AdamW weight decay, kept when not searched.
    """
    from components.tune.selection import choose_from_results

    best = choose_from_results("transformer", results, goal, max_failed_trials, dict(
        learning_rate=learning_rate, batch_size=batch_size, warmup_ratio=warmup_ratio,
        weight_decay=weight_decay), trials)
    return best["learning_rate"], best["batch_size"], best["warmup_ratio"], best["weight_decay"]


SELECT_TRIAL = {"image": select_image_trial, "text": select_text_trial,
                "transformer": select_transformer_trial}
