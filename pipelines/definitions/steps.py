"""The steps of one pipeline build, made once from the image and the settings; a body
calls them by role, never asking which target it compiles for."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import inspect
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from kfp import dsl
from kfp.dsl import pipeline_channel

from components.evaluate_image import component as evaluate_image
from components.evaluate_text import component as evaluate_text
from components.predict import component as predict
from components.preflight import component as preflight
from components.prepare_text import component as prepare_text
from components.prepare_text import contract as prepare_contract
from components.register import component as register
from components.shard import component as shard
from components.shard import contract as shard_contract
from components.track import component as track
from components.train_image import component as train_image
from components.train_image import contract as image_contract
from components.train_lm import component as train_lm
from components.train_lm import contract as lm_contract
from components.train_text import component as train_text
from components.train_text import contract as text_contract
from components.train_transformer import component as train_transformer
from components.train_transformer import contract as transformer_contract
from pipelines.definitions import help_text, tuning


class Target(Protocol):
    """Where a pipeline's steps run: `vertex.VertexSettings`, `kubeflow.KubeflowSettings`."""

    default_job_account: str
    words: help_text.Words

    def wrap(self, component: Callable, step: str, display_name: str) -> Callable:
        """The component of a step with machines (`step`), as it runs there."""

    def place(self, task, step: str):
        """The task on its nodes; `step` is empty for a light step."""

    def job(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """What every job of the run takes from the pipeline parameters."""

    def preflight_inputs(self) -> dict[str, str]:
        """Compile-time settings the preflight checks a run against."""

    def search(self, trainer: Callable, kind: str, tune: tuning.TuningSettings, step: str,
               display_name: str, image: str) -> Callable:
        """The tuning variant's `search(training, job) -> training`."""

    def registration(self, kind: str, image: str) -> Callable | None:
        """`add(params, model)` registering a model, called under the gate's condition;
        None where nothing is."""


@dataclasses.dataclass(frozen=True)
class Step:
    """One step of a pipeline kind.

    Attributes:
        function: The step's KFP function (`components.<step>.component`).
        display_name: The task's name in the run graph.
        machine: Its key in `machine.DEFAULT_MACHINES`; empty for a light step.
        job_name: The custom job's name in the console.
        settings: Its settings class: its fields among the inputs are pipeline parameters.
        hidden: Such inputs that are no pipeline parameter.
    """

    function: Callable
    display_name: str
    machine: str = ""
    job_name: str = ""
    settings: type | None = None
    hidden: tuple[str, ...] = ()


# What every classifier pipeline runs after its evaluation.
_AFTER_EVALUATION = {
    "gate": Step(register.registration_gate, "registration-gate"),
    "track": Step(track.track_classifier, "track-run"),
}
_TEXT = {
    "prepare": Step(prepare_text.prepare_text_data, "prepare-text", "prepare_text",
                    "prepare-text", settings=prepare_contract.PrepareConfig),
    "evaluate": Step(evaluate_text.evaluate_text_classifier, "evaluate-text", "evaluate_text",
                     "evaluate-text"),
    "predict": Step(predict.predict, "predict", "predict_text", "predict-texts"),
    **_AFTER_EVALUATION,
}
# Each pipeline kind's steps by role.
STEPS: Mapping[str, Mapping[str, Step]] = {
    "image": {
        # the pipeline's shard_workers is num_workers
        "shard": Step(shard.shard_images, "shard-images", "shard", "shard-images",
                      settings=shard_contract.ShardConfig, hidden=("num_workers",)),
        "train": Step(train_image.train_image_classifier, "train-densenet121", "train_image",
                      "train-densenet121", settings=image_contract.TrainConfig,
                      hidden=("shuffle_buffer", "validation_steps")),
        "evaluate": Step(evaluate_image.evaluate_image_classifier, "evaluate",
                         "evaluate_image", "evaluate-image-classifier"),
        "predict": Step(predict.predict, "predict", "predict_image", "predict-images"),
        **_AFTER_EVALUATION,
    },
    "text": {
        "train": Step(train_text.train_text_classifier, "train-text", "train_text",
                      "train-text", settings=text_contract.TrainConfig),
        **_TEXT,
    },
    "transformer": {
        "train": Step(train_transformer.train_transformer_classifier, "train-transformer",
                      "train_transformer", "train-transformer",
                      settings=transformer_contract.TransformerConfig),
        **_TEXT,
    },
    "lm": {
        "train": Step(train_lm.train_language_model, "train-language-model", "train_lm",
                      "train-language-model", settings=lm_contract.LMConfig),
        "track": Step(track.track_language_model, "track-run"),
    },
}
# Kinds with a tuning variant: the tuning step's name in the run graph and the console.
TUNING_JOBS = {"image": "tune-densenet121", "text": "tune-text",
               "transformer": "tune-transformer"}
# The tracking step's `kind` for each classifier: both text trainers' history rows are alike.
TRACKED_AS = {"image": "image", "text": "text", "transformer": "text"}
# Kinds whose registered models the runtime image serves; image models: `--serving-image`.
SERVED_BY_THE_RUNTIME = ("text", "transformer")


@functools.cache
def component(function: Callable, image: str):
    """A step's KFP component, made once per process: `function` run in `image` (which holds
    this package, the frameworks and kfp) as the container's first process."""
    made = dsl.component(function, base_image=image, install_kfp_package=False)
    command = made.component_spec.implementation.container.command
    # KFP's `sh -ec` script starts python as its child, and the SIGTERM of a preemption
    # goes to PID 1, the shell, which ignores it: exec'd, python gets it and seals.
    if command[:2] != ["sh", "-ec"] or command[2].count(KFP_EXECUTOR_LINE) != 1:
        raise RuntimeError(f"this kfp's component command is not the one known: {command[:3]}")
    command[2] = command[2].replace(KFP_EXECUTOR_LINE, KFP_EXECUTOR_LINE.replace(
        "python3", "exec python3"))
    return made


KFP_EXECUTOR_LINE = "_KFP_RUNTIME=true python3 -m kfp.dsl.executor_main"


class Steps:
    """One pipeline build's steps, made before its body and called in it by role.

    Args:
        kind: The pipeline kind, a key of `STEPS`.
        image: URI of the runtime image every step runs in.
        target: Where each step runs; None for the local (`kfp.local`) variant.
        tune: Compiles the tuning variant, searching `tune.spaces[kind]`.

    Raises:
        ValueError: `tune` without a target.
    """

    def __init__(self, kind: str, image: str, target: Target | None = None,
                 tune: tuning.TuningSettings | None = None):
        if tune is not None and target is None:
            raise ValueError("the tuning variant runs on a target: give its settings")
        self.kind, self.target, self.table, self.image = kind, target, STEPS[kind], image
        self.default_job_account = target.default_job_account if target is not None else ""
        self.words = target.words if target is not None else None
        made = {role: component(step.function, image) for role, step in self.table.items()}
        # All made before a body makes a task (kubeflow/pipelines#9320); trials: unwrapped.
        self.search = None
        if tune is not None:
            self.search = target.search(made["train"], kind, tune,
                                        self.table["train"].machine, TUNING_JOBS[kind], image)
        self.ops = {role: op if target is None or not self.table[role].machine else
                    target.wrap(op, self.table[role].machine, self.table[role].job_name)
                    for role, op in made.items()}
        self.registration = (target.registration(kind, image)
                             if target is not None and "gate" in self.table else None)
        self.experiment = ""
        self.fed: dict[str, set[tuple[str, str]]] = {}  # parameter -> (role, input) it feeds

    def signature(self, first: Sequence[inspect.Parameter],
                  last: Sequence[inspect.Parameter]) -> inspect.Signature:
        """The pipeline's parameters: `first`, each setting of its steps in the order they
        run, `last`, and `job_service_account`.

        Raises:
            ValueError: A parameter of `first` or `last` is also a step's setting.
        """
        parameters = {parameter.name: parameter for parameter in first}
        for role in ("shard", "prepare", "train"):  # the order they run in
            step = self.table.get(role)
            if step is None or step.settings is None:
                continue
            fields = {field.name for field in dataclasses.fields(step.settings)}
            for name, declared in inspect.signature(step.function).parameters.items():
                if name in fields and name not in step.hidden:
                    parameters.setdefault(name, declared)
        for own in [*last, parameter("job_service_account", str, self.default_job_account)]:
            if own.name in parameters:
                raise ValueError(f"{own.name} is a setting of a step: leave it out of the "
                                 "pipeline's own parameters")
            parameters[own.name] = own
        return inspect.Signature(list(parameters.values()))

    def pipeline(self, name: str, tuning_name: str, lead: str, rest: str,
                 first: Sequence[inspect.Parameter] = (),
                 last: Sequence[inspect.Parameter] = ()) -> Callable:
        """The build's `@dsl.pipeline` decorator over the body `body(params)`: `name` (also
        the experiment runs are tracked in) or `tuning_name`, the description `lead` and
        `rest` around the tuning variant's `words.tuning_clause`, and the parameters
        `signature(first, last)` as the target says them (`spoken`)."""
        self.experiment = name
        tuned = self.search is not None
        decorate = dsl.pipeline(name=tuning_name if tuned else name, description=lead + (
            self.words.tuning_clause if tuned else "") + rest)

        def define(body: Callable):
            said = spoken(body, self.signature(first, last), self.words)
            # Made before the body makes a task, as the others (kubeflow/pipelines#9320).
            self.ops["preflight"] = component(preflight.preflight_function(
                self.kind, list(inspect.signature(said).parameters.values())), self.image)
            # each kfp task setting calls `inspect.stack()`: short on a fresh thread
            with concurrent.futures.ThreadPoolExecutor(1) as pool:
                graph = pool.submit(decorate, said).result()
            self._describe(graph, body.__name__)
            return graph

        return define

    def _describe(self, graph, function: str) -> None:
        """Gives each parameter of `graph` its help: the target's words, else `help_text`,
        else that of the step inputs it feeds; raises LookupError where it has no home."""
        inputs = graph.pipeline_spec.root.input_definitions.parameters
        words = self.words or help_text.Words("")
        own = {**help_text.HELP, **help_text.OWN_HELP.get(function, {})}
        stray = set(help_text.OWN_HELP.get(function, {})) - set(inputs) - set(words.dropped)
        if stray:
            raise LookupError(f"help_text.OWN_HELP[{function!r}]: no such parameter: "
                              f"{sorted(stray)}")
        feeds = {name: set(fed) for name, fed in self.fed.items()}
        for role, step in self.table.items():  # a tuned setting feeds the trainer by name
            for key in inspect.signature(step.function).parameters if step.settings else ():
                if key in inputs:
                    feeds.setdefault(key, set()).add((role, key))
        renames: dict[str, dict[str, str]] = {}
        for name, fed in feeds.items():
            for role, key in fed:
                if key != name and "_" in key and key not in inputs:
                    renames.setdefault(role, {})[key] = name
        for name, parameter in inputs.items():
            texts = {_renamed(self._step_help(role, key), renames.get(role, {}))
                     for role, key in feeds.get(name, ())}
            if name in own and texts == {own[name]}:
                raise LookupError(f"{function}.{name}: its help in help_text is its step's")
            if name not in own and (len(texts) != 1 or "" in texts):
                raise LookupError(f"{function}.{name} feeds no step input, or inputs whose "
                                  "help differs: give it help in help_text")
            text = own[name] if name in own else texts.pop()
            for old, new in words.rewrites:
                text = text.replace(old, new)
            parameter.description = words.help.get(name, text)
            graph.component_spec.inputs[name].description = parameter.description

    def _step_help(self, role: str, key: str) -> str:
        """The help of the step `role`'s input `key` (its function's `Args:` entry)."""
        found = component(self.table[role].function, self.image).component_spec.inputs or {}
        return found[key].description or "" if key in found else ""

    def _placed(self, task, machine: str):
        """`task` as the target places it on `machine` (empty: a light step)."""
        return task if self.target is None else self.target.place(task, machine)

    def job(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """What every job of the run takes: on Vertex, the run's `job_service_account`."""
        return self.target.job(params) if self.target is not None else {}

    def preflight(self, params: Mapping[str, Any]):
        """The preflight task: every pipeline parameter and the target's compile-time
        settings, checked before the first paid job; never cached (it fingerprints data)."""
        op = self.ops["preflight"]
        settings = self.target.preflight_inputs() if self.target is not None else {}
        task = op(**{name: value for name, value in params.items()
                     if name in op.component_spec.inputs}, **settings)
        return self._placed(task.set_display_name("preflight").set_caching_options(False), "")

    def run(self, role: str, params: Mapping[str, Any], **arguments):
        """The task of the step `role`, named in the run graph.

        Args:
            role: A key of the kind's `STEPS`.
            params: The pipeline parameters by name (the body's `params`).
            **arguments: The step's inputs; a step with `settings` also takes every pipeline
                parameter named as one of its inputs (`arguments` win).
        """
        step = self.table[role]
        if step.settings:
            arguments = {**_named_inputs(step.function, params), **arguments}
        for key, value in arguments.items():  # what the parameter's help is (`_describe`)
            if isinstance(value, pipeline_channel.PipelineParameterChannel) and not value.task_name:
                self.fed.setdefault(value.name, set()).add((role, key))
        job = self.job(params) if step.machine else {}
        return self._placed(self.ops[role](**arguments, **job).set_display_name(
            step.display_name), step.machine)

    def train(self, params: Mapping[str, Any], **arguments):
        """The training task; in the tuning variant the target's search comes first, and
        training takes the best trial's values."""
        if self.search is None:
            return self.run("train", params, **arguments)
        training = {**_named_inputs(self.table["train"].function, params), **arguments}
        return self.run("train", params, **self.search(training, self.job(params)))

    def evaluate_and_publish(self, outputs: type, params: Mapping[str, Any], train, dataset,
                             split, predict_fingerprint):
        """What follows training in every classifier pipeline: evaluation of `train`'s
        model on `dataset`'s `split`, the gate, the upload, prediction and tracking.

        Returns:
            The pipeline's `outputs` (its NamedTuple), each field taken by name from the
            model, `dataset`, the evaluation's outputs and the gate's decision ("register").

        Raises:
            ValueError: In a body not decorated by `pipeline` (no experiment).
        """
        if not self.experiment:
            raise ValueError("decorate the pipeline body with steps.pipeline(...): it names "
                             "the experiment the run is tracked in")
        model = train.outputs["model"]
        evaluate = self.run("evaluate", params, model=model, dataset=dataset, split=split,
                            batch_size=params["eval_batch_size"])
        gate = self.run("gate", params, evaluation=evaluate.outputs["evaluation"],
                        metric=params["registration_metric"],
                        threshold=params["registration_threshold"],
                        enabled=params["register_model"],
                        beat_baselines=params["registration_beats_baselines"])
        if self.registration is not None:  # none locally
            with dsl.If(gate.outputs["Output"] == True, name="model-clears-threshold"):  # noqa: E712
                self.registration(params, model)
        self.predict(params, model=model, data_fingerprint=predict_fingerprint)
        self.track(params, self.experiment, model=model,
                   evaluation=evaluate.outputs["evaluation"], kind=TRACKED_AS[self.kind])
        named = {**evaluate.outputs, "model": model, "dataset": dataset,
                 "register": gate.outputs["Output"]}
        return outputs(**{field: named[field] for field in outputs._fields})

    def predict(self, params: Mapping[str, Any], **arguments) -> None:
        """Batch prediction of `predict_uri`'s data, when it is set."""
        with dsl.If(params["predict_uri"] != "", name="prediction-requested"):
            self.run("predict", params, data_uri=params["predict_uri"],
                     batch_size=params["eval_batch_size"], **arguments)

    def track(self, params: Mapping[str, Any], experiment: str, **arguments) -> None:
        """One MLflow run of `arguments` in `experiment` when `tracking_uri` is set; never
        cached: a re-run logs again."""
        with dsl.If(params["tracking_uri"] != "", name="tracking-requested"):
            self.run("track", params, tracking_uri=params["tracking_uri"],
                     run_name=dsl.PIPELINE_JOB_NAME_PLACEHOLDER, experiment=experiment,
                     **arguments).set_caching_options(False)


def parameter(name: str, annotation: type,
              default: Any = inspect.Parameter.empty) -> inspect.Parameter:
    """A pipeline's own parameter (`Steps.signature`)."""
    return inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default,
                             annotation=annotation)


def classifier_parameters(metric: str, threshold: float,
                          model_name: str) -> list[inspect.Parameter]:
    """What every classifier pipeline takes after its steps' settings, with its gate's and
    registered model's defaults (for `Steps.evaluate_and_publish`)."""
    return [parameter("eval_batch_size", int, 64), parameter("register_model", bool, True),
            parameter("registration_metric", str, metric),
            parameter("registration_threshold", float, threshold),
            parameter("registration_beats_baselines", bool, False),
            parameter("model_display_name", str, model_name),
            parameter("predict_uri", str, ""), parameter("tracking_uri", str, "")]


def spoken(body: Callable, signature: inspect.Signature,
           words: help_text.Words | None) -> Callable:
    """The pipeline function KFP reads: `signature` less `words.dropped`, calling `body`
    with every parameter by name (a dropped one at its default)."""
    every = signature.parameters.values()
    dropped = {p.name: p.default for p in every if words and p.name in words.dropped}
    kept = signature.replace(parameters=[p for p in every if p.name not in dropped],
                             return_annotation=inspect.signature(body).return_annotation)

    @functools.wraps(body)
    def pipeline(*args, **kwargs):
        return body({**dropped, **kept.bind(*args, **kwargs).arguments})

    pipeline.__signature__ = kept
    pipeline.__annotations__ = {**{p.name: p.annotation for p in kept.parameters.values()},
                                "return": kept.return_annotation}
    return pipeline


def _renamed(text: str, names: Mapping[str, str]) -> str:
    for old, new in names.items():
        text = re.sub(rf"\b{re.escape(old)}\b", new, text)
    return text


def _named_inputs(function: Callable, params: Mapping[str, Any]) -> dict[str, Any]:
    """The pipeline parameters named as `function`'s inputs."""
    return {name: params[name] for name in inspect.signature(function).parameters
            if name in params}
