"""KFP face of the transformer training step: `train_transformer_classifier` takes every field
of `contract.TransformerConfig` between its artifacts and its run inputs; the TrainJob
launcher `train_transformer_trainjob` takes its node settings, then the same."""

import dataclasses
import os
import types
import typing
from typing import Any

from kfp.dsl import Dataset, Input, Metrics, Model, Output

from components.common.written import HELP, settings_from_step, step_function
from components.train_transformer import multinode
from components.train_transformer.contract import FRAMEWORK, TransformerConfig

DATASET_HELP = ("Folder from the text preparation step: train/validation/test CSVs and "
                "manifest.json (labels, task).")
ONE_POD = "train_transformer_classifier"


def train_step(values: dict) -> None:
    """The one-pod step's work on its inputs (`values`, by name): trains, records outputs."""
    import logging

    from components.train_transformer.launch import train

    logging.basicConfig(level=logging.INFO)  # one line per epoch in the job's log
    config = settings_from_step(TransformerConfig, values)
    dataset, model = values["dataset"], values["model"]
    result = train(dataset.path, model.path, config,
                   tensorboard_folder=values["tensorboard_dir"] or None,
                   hypertune_metric=values["hypertune_metric"] or None)
    if result is None:  # another replica: the primary's outputs are the step's (KFP writes
        return  # the executor output of workerpool0 only), and its files may not show here
    record_outputs(result, model, values["metrics"], dataset.path, config,
                   values["model_fingerprint"])


def record_outputs(result: dict[str, Any], model, metrics, dataset_dir: str,
                   config: TransformerConfig, model_fingerprint: str) -> None:
    """Reports the model folder: validation scalars in `metrics`, the model's metadata.

    Args:
        result: The training result (the model's metrics.json).
        model, metrics: The step's `Output[Model]` (the folder at its `path`), `Output[Metrics]`.
        dataset_dir: The preparation step's folder (its manifest fingerprints the data).
        config: The run's settings.
        model_fingerprint: The preflight's digest of a `model_name` folder.
    """
    from components.common.provenance import provenance
    from components.prepare_text.contract import MANIFEST
    from components.text_common.scores import validation_scalars

    for name, value in validation_scalars(result).items():
        metrics.log_metric(name, float(value))
    model.metadata.update({
        "framework": FRAMEWORK,
        "arch": result["run"]["arch"],
        "task": result["task"],
        "labels": result["labels"],
        "model_fingerprint": model_fingerprint,
        "learnt_nothing": result["run"]["learnt_nothing"] or "",
        "files": sorted(os.listdir(model.path)),
        **provenance(os.path.join(dataset_dir, MANIFEST), dataclasses.asdict(config)),
    })


def written_step(settings: type = TransformerConfig):
    """`train_transformer_classifier` written from `settings`."""
    return step_function(
        ONE_POD, settings,
        "Fine-tunes a pretrained Hugging Face encoder end to end (transformers Trainer, "
        "PyTorch DDP across replicas and GPUs).",
        before=[
            ("dataset", Input[Dataset], DATASET_HELP),
            ("model", Output[Model], "Output folder: the model and tokenizer as save_pretrained "
             "writes them (config.json, model.safetensors, tokenizer files), `labels.json` "
             "(labels, task, threshold, per-label tuned thresholds, max_length), `metrics.json` "
             "(validation scores, per-epoch history) and `per_label_metrics.json`."),
            ("metrics", Output[Metrics], "Validation scalars: micro/macro F1 at the threshold "
             "and at tuned thresholds (multi-label), or accuracy and macro F1 (single-label); "
             "epochs and seconds per epoch."),
        ],
        after=[
            ("model_fingerprint", "", "Digest of a model_name folder's listing from the "
             "preflight step; not read, it only makes the cache key change when the folder "
             "does. Recorded in the model metadata."),
            ("tensorboard_dir", "", "Folder (gs:// or local) of TensorBoard logs, one point per "
             "epoch (classifier/<field>); empty: $AIP_TENSORBOARD_LOG_DIR (this task's "
             "sub-folder), else none."),
            ("hypertune_metric", "", "Set by the trials of a Vertex tuning job: the epoch value "
             "(e.g. micro_f1, valid_loss) reported to the tuning service after each epoch; "
             "empty reports nothing."),
        ],
        runs="components.train_transformer.component:train_step")


def trainjob_step(values: dict) -> None:
    """The TrainJob launcher's work on its inputs (`values`): the one-pod settings on nodes."""
    config = settings_from_step(TransformerConfig, values)
    dataset, model = values["dataset"], values["model"]
    result = multinode.train_on_nodes(
        node_settings(values), dataset_uri=dataset.uri, dataset_path=dataset.path, model_path=model.path,
        config=dataclasses.asdict(config), tensorboard_dir=values["tensorboard_dir"])
    record_outputs(result, model, values["metrics"], dataset.path, config,
                   values["model_fingerprint"])


def _node_inputs() -> list[tuple[dataclasses.Field, str]]:
    """Each `NodeSettings` field and its step input's name."""
    return [(field, multinode.STEP_INPUTS.get(field.name, field.name))
            for field in dataclasses.fields(multinode.NodeSettings)]


def node_settings(values: dict) -> multinode.NodeSettings:
    """The nodes the TrainJob launcher's inputs (`values`, by name) describe."""
    return multinode.NodeSettings(**{field.name: values[step] for field, step in _node_inputs()})


def _input_type(hint: Any) -> type:
    """A node setting's KFP input type: `int | None` is int, `list[str]` is list."""
    if isinstance(hint, types.UnionType):
        hint = typing.get_args(hint)[0]
    return typing.get_origin(hint) or hint


def written_trainjob(settings: type = TransformerConfig):
    """`train_transformer_trainjob` written from `settings`: its node settings (no default:
    the pipeline gives each), then every input of the one-pod trainer but its artifacts, in
    the same order."""
    same = f"As {ONE_POD}'s."
    hints = typing.get_type_hints(multinode.NodeSettings)
    return step_function(
        "train_transformer_trainjob", settings,
        "Fine-tunes the transformer classifier across nodes: a Kubeflow Trainer TrainJob this "
        "pod creates, follows and deletes (Kubeflow only).",
        before=[
            ("dataset", Input[Dataset], DATASET_HELP),
            ("model", Output[Model], "Output folder, as the one-pod step writes it (the model "
             "node 0 wrote, copied here)."),
            ("metrics", Output[Metrics], "Validation scalars, as the one-pod step logs them."),
            *((step, _input_type(hints[field.name]), field.metadata[HELP])
              for field, step in _node_inputs()),
        ],
        after=[
            ("model_fingerprint", "", same),
            ("tensorboard_dir", "", "TensorBoard folder the nodes write to; empty: "
             "<checkpoint_root>/tensorboard."),
            ("hypertune_metric", "", "Not read: tuning trials stay one pod (the tuning variant "
             "refuses replicas on Kubeflow)."),
        ],
        runs="components.train_transformer.component:trainjob_step",
        helps={**{field.name: same for field in dataclasses.fields(settings)},
               "batch_size": "Texts per batch on each process."})


train_transformer_classifier = written_step()
train_transformer_trainjob = written_trainjob()
