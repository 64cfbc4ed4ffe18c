"""The help of the pipeline parameters that is no step's (`steps.Steps._describe` takes
the rest from the step input each feeds), and each target's `Words` where they differ."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

# What a job's account is, after the jobs it runs.
_JOB_ACCOUNT = ("as on Vertex; empty: Vertex's Custom Code Service Agent. Not the pipeline "
                "run's own account. Ignored by local runs.")

# Help of a parameter in every pipeline that has it, unless OWN_HELP gives that pipeline its own.
HELP = {
    "eval_batch_size": "Texts per forward pass in the evaluation (and prediction).",
    "register_model": "Upload the model to the Vertex Model Registry when it clears the "
                      "threshold.",
    "registration_metric": 'Evaluation metric compared with the threshold: "micro_f1" (the '
                           'accuracy for one class per row) or "macro_f1".',
    "registration_threshold": "Register only when the metric on the evaluated split is at "
                              "least this.",
    "registration_beats_baselines": "Also require the metric above every cheap baseline the "
                                    "evaluation scored on the same split (logistic regression "
                                    "on TF-IDF, and the constant answer).",
    "model_display_name": "Name of the model in the Model Registry; a later run adds a "
                          "version to it.",
    "predict_uri": "gs:// CSV of new texts (the training text column) to label with the "
                   "trained model, one JSON line per row; empty skips prediction.",
    "tracking_uri": "MLflow tracking server URL (http/https), sqlite:///FILE, or a gs:// "
                    "folder used as a file store; one MLflow run per pipeline run, named "
                    "after it. Empty: no tracking.",
    "job_service_account": "Service account the custom jobs (preparation, training, "
                           "evaluation, prediction) run " + _JOB_ACCOUNT,
}

# One pipeline's own help (by its function's name), over HELP and the steps'.
OWN_HELP = {
    "image_pipeline": {
        "seed": "Seed of the split, shuffles, initialisation and augmentation.",
        "eval_batch_size": "Images per forward pass in the evaluation (and prediction).",
        "registration_metric": 'Evaluation metric compared with the threshold: "accuracy" or '
                               '"macro_f1".',
        "registration_threshold": "Register only when the metric on the test split is at "
                                  "least this.",
        "registration_beats_baselines": "Also require the metric above every cheap baseline "
                                        "the evaluation scored on the same split (logistic "
                                        "regression on downscaled pixels, and the constant "
                                        "answer).",
        "predict_uri": "gs:// folder of new images (any depth) to label with the trained "
                       "model, one JSON line each; empty skips prediction.",
        "job_service_account": "Service account the custom jobs (sharding, training, "
                               "evaluation, prediction) run " + _JOB_ACCOUNT,
    },
    "text_pipeline": {
        "seed": "Seed of the split, initialisation and batch order.",
    },
    "transformer_pipeline": {
        "seed": "Seed of the split, the classification head's initialisation and the batch "
                "order.",
    },
    "lm_pipeline": {
        "job_service_account": "Service account the training job runs " + _JOB_ACCOUNT,
    },
}


@dataclasses.dataclass(frozen=True)
class Words:
    """What one target's pipelines say where the targets differ.

    Attributes:
        tuning_clause: The middle of the tuning variant's description.
        help: Parameter -> its help on this target, over any other.
        dropped: Parameters that mean nothing on this target (the body takes their defaults).
        rewrites: (old, new) texts replaced in every other parameter's help.
    """

    tuning_clause: str
    help: Mapping[str, str] = dataclasses.field(default_factory=dict)
    dropped: tuple[str, ...] = ()
    rewrites: tuple[tuple[str, str], ...] = ()


VERTEX = Words("tunes hyperparameters in a Vertex tuning job, ")
KUBEFLOW = Words(
    "tunes hyperparameters by random search (trials side by side, each a pod of a "
    "ParallelFor), ",
    help={
        "register_model": "Register the model when it clears the threshold: a version in the "
                          "MLflow Model Registry of tracking_uri, with the KServe "
                          "InferenceService manifest that serves it; without tracking_uri "
                          "nothing is registered.",
        "model_display_name": "Name of the registered model in the MLflow Model Registry; a "
                              "later run adds a version to it.",
        # a gs:// file store is written through Vertex's /gcs mount, a scratch folder here
        "tracking_uri": "MLflow tracking server URL (http/https) the pods reach; one MLflow "
                        "run per pipeline run, named after it. Empty: no tracking.",
    },
    # the run's Kubernetes service account is chosen when the run is created
    dropped=("job_service_account",),
    # the steps read s3:// (AWS, MinIO, SeaweedFS, Ceph) as they read gs://
    rewrites=(("gs://", "s3:// or gs://"),),
)
