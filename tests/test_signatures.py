"""Defaults and help have one home: steps take them from settings, pipelines from steps."""

import dataclasses
import inspect
import json
import re
from pathlib import Path

import pytest

import compile as compile_cli
from components.common.written import setting
from components.train_image.contract import TrainConfig as ImageTrainConfig
from components.train_transformer.contract import TransformerConfig
from pipelines.definitions import help_text

ROOT = Path(__file__).resolve().parents[1]
PIPELINES = tuple(f"pipelines.definitions.{kind}"
                  for kind in ("image", "text", "transformer", "lm"))


def test_a_tunable_parameter_is_one_edit_of_the_table(monkeypatch):
    """Adding a tunable parameter to contract.TUNABLE gives both selection steps its input,
    help and output; a trial takes its point, then exactly what its trainer takes."""
    from kfp import dsl

    from components.train_image.component import train_image_classifier
    from components.tune import component as tune

    monkeypatch.setitem(tune.TUNABLE, "text", {**tune.TUNABLE["text"], "seq_len": int})
    for step in (tune.best_trial("text"), tune.select_trial("text")):
        spec = dsl.component(step, base_image="img:1").component_spec
        assert spec.inputs["seq_len"].type == spec.outputs["seq_len"].type == "Integer"
        assert spec.inputs["seq_len"].description == tune.TUNED_HELP
    trial = inspect.signature(tune.trial("image")).parameters
    assert list(trial)[:3] == ["trial_point", "study_metric", "study_goal"]
    assert list(trial.values())[3:] == list(
        inspect.signature(train_image_classifier).parameters.values())


@dataclasses.dataclass(frozen=True)
class OneMoreSetting(ImageTrainConfig):
    """The image trainer's settings after one edit: a new setting, and another default."""

    batch_size: int = setting(64, "Examples per replica per step.")
    label_smoothing: float = setting(0.1, "How much of each label is spread over the others.")


def test_one_settings_edit_reaches_the_step_the_pipelines_their_help_and_the_preflight(
        monkeypatch, tmp_path):
    """A setting added to TrainConfig (and a default changed) is one edit: the step is
    written from the class, and both image pipelines, their console help, the preflight
    and the tuning variant's training step take it when built."""
    from components.common.written import settings_from_step
    from components.train_image import component as train_image_component
    from pipelines.definitions import image, steps

    function = train_image_component.written_step(OneMoreSetting)
    parameters = inspect.signature(function).parameters
    assert parameters["label_smoothing"].default == 0.1
    assert parameters["batch_size"].default == 64
    assert "label_smoothing: How much of each label" in inspect.getsource(function)
    values = {name: p.default for name, p in parameters.items()}
    assert settings_from_step(OneMoreSetting, values).label_smoothing == 0.1
    table = dict(steps.STEPS["image"])
    table["train"] = dataclasses.replace(table["train"], function=function,
                                         settings=OneMoreSetting)
    monkeypatch.setitem(steps.STEPS, "image", table)
    spec = image.build("img:1").pipeline_spec
    root = spec.root.input_definitions.parameters
    assert root["label_smoothing"].default_value.number_value == 0.1
    assert root["batch_size"].default_value.number_value == 64
    for component in ("comp-preflight-image", "comp-train-image-classifier"):
        assert "label_smoothing" in spec.components[component].input_definitions.parameters
    # compiled for Vertex, the tuning variant too: the console's help, the tuning job's step
    out = tmp_path / "build"
    assert compile_cli.main(["--output-dir", str(out), "--pipelines",
                             "image_pipeline,image_tuning_pipeline"]) == 0
    for name, trainer in (("image_pipeline", "train-image-classifier"),
                          ("image_tuning_pipeline", "tune-train-image-classifier")):
        compiled = json.loads((out / f"{name}.json").read_text())
        root = compiled["root"]["inputDefinitions"]["parameters"]
        assert root["label_smoothing"]["description"] == ("How much of each label is spread "
                                                          "over the others.")
        task = compiled["root"]["dag"]["tasks"][trainer]["inputs"]["parameters"]
        assert task["label_smoothing"]["componentInputParameter"] == "label_smoothing"


def test_the_transformer_recipe_table_shows_the_settings_defaults():
    """docs/users.md's recipe table quotes TransformerConfig's defaults."""
    users = (ROOT / "docs" / "users.md").read_text()
    table = users[users.index("| recipe |"):].split("\n\n")[0]
    quoted = dict(re.findall(r"`(\w+)` ([0-9.e-]+)", table))
    defaults = dataclasses.asdict(TransformerConfig())
    assert len(quoted) >= 6
    for name, text in quoted.items():
        assert float(text) == pytest.approx(defaults[name]), name


# learning_rate's help in each step that declares it, and the trainer whose rule it is.
LEARNING_RATE_HELP = (
    ("components.train_text.component", "train_text_classifier", "text"),
    ("components.train_lm.component", "train_language_model", "lm"),
)


def _described(module: str, name: str, image: str = "img:1") -> str:
    """The help of pipeline parameter `name` as its build describes it (the console's)."""
    import importlib

    spec = importlib.import_module(module).build(image).pipeline_spec
    return spec.root.input_definitions.parameters[name].description


def _help(module: str, function: str, name: str) -> str:
    """The `name: help` line of a step's docstring (its console help)."""
    import importlib

    doc = inspect.getdoc(getattr(importlib.import_module(module), function))
    (line,) = [text.strip() for text in doc.splitlines() if text.strip().startswith(name + ":")]
    return line


def test_learning_rate_help_names_the_rule_and_bounds_the_code_uses():
    """learning_rate=0: fastai's valley, held to the bounds each trainer holds it to
    (choose_rate), which the trainers take from their contracts, where the help is made."""
    from components.train_lm import training as lm_training
    from components.train_text import schedule
    from components.train_text.contract import rate_text as rate

    bounds = {
        "text": (rate(schedule.MIN_FOUND_LR), rate(schedule.MAX_FOUND_LR_WHOLE),
                 rate(schedule.MAX_FOUND_LR_HEAD), str(schedule.BOUNDS_N_HID)),
        "lm": (f"{rate(lm_training.MIN_FOUND_LR)}..{rate(lm_training.MAX_FOUND_LR)}",),
    }
    assert rate(0.003) == "3e-3" and rate(0.0025) == "2.5e-3"
    for module, function, kind in LEARNING_RATE_HELP:
        line = _help(module, function, "learning_rate")
        assert "valley" in line and "steep" not in line and "minimum" not in line, line
        for text in bounds[kind]:
            assert text in line, (module, text)
        pipeline = f"pipelines.definitions.{kind}"  # the pipeline says its trainer's help
        assert f"learning_rate: {_described(pipeline, 'learning_rate')}" == line


def test_a_settings_help_reaches_the_step_and_the_pipelines_it_feeds(monkeypatch):
    """Changing a setting's help is one edit: the step written from its class says it, and
    the pipelines it feeds describe the parameter so."""
    from components.prepare_text import component as prepare_text
    from components.prepare_text.contract import PrepareConfig
    from pipelines.definitions import steps

    @dataclasses.dataclass(frozen=True)
    class Edited(PrepareConfig):
        text_column: str = setting("text", "Texts.")

    function = prepare_text.written_step(Edited)
    assert "text_column: Texts." in inspect.getdoc(function)
    for kind in ("text", "transformer"):
        table = dict(steps.STEPS[kind])
        table["prepare"] = dataclasses.replace(table["prepare"], function=function,
                                               settings=Edited)
        monkeypatch.setitem(steps.STEPS, kind, table)
    for module in ("pipelines.definitions.text", "pipelines.definitions.transformer"):
        # a new image: the steps' components are made once per image
        assert _described(module, "text_column", "img:step-help") == "Texts."


def test_a_pipelines_own_help_comes_from_help_text_and_a_step_input_takes_its_name(
        monkeypatch):
    text = "pipelines.definitions.text"
    # the trainer's help names its input lm_assets_uri: the pipeline's parameter is lm_assets
    line = _described(text, "pretrained")
    assert "lm_assets_uri" not in line and "the one in lm_assets " in line
    assert _described(text, "seed") == help_text.OWN_HELP["text_pipeline"]["seed"]
    # changing a help every pipeline shares is one edit too
    monkeypatch.setitem(help_text.HELP, "tracking_uri", "Where MLflow is.")
    for module in PIPELINES:
        assert _described(module, "tracking_uri") == "Where MLflow is."


def test_help_with_no_home_or_two_homes_or_for_no_parameter_is_refused(monkeypatch):
    text = "pipelines.definitions.text"
    # seed feeds the split and the trainer, whose help differs: the pipeline must say it
    monkeypatch.delitem(help_text.OWN_HELP["text_pipeline"], "seed")
    with pytest.raises(LookupError, match="text_pipeline.seed feeds no step input, or"):
        _described(text, "seed")
    monkeypatch.undo()
    # help the step already gives, said again here, is a second home
    monkeypatch.setitem(help_text.OWN_HELP["text_pipeline"], "text_column",
                        "Name of the column holding the texts.")
    with pytest.raises(LookupError, match="text_pipeline.text_column: its help in"):
        _described(text, "seed")
    monkeypatch.undo()
    monkeypatch.setitem(help_text.OWN_HELP["text_pipeline"], "no_such_parameter", "Help.")
    with pytest.raises(LookupError, match="no such parameter: \\['no_such_parameter'\\]"):
        _described(text, "seed")


def test_every_shared_help_and_targets_word_speaks_of_a_pipeline_parameter():
    """`help_text.HELP` and each target's `Words` name parameters some pipeline has."""
    import importlib

    known = set()
    for module in PIPELINES:
        spec = importlib.import_module(module).build("img:1").pipeline_spec
        known |= set(spec.root.input_definitions.parameters)
    for words in (help_text.VERTEX, help_text.KUBEFLOW):
        assert set(words.help) | set(words.dropped) <= known
    assert set(help_text.HELP) <= known


@dataclasses.dataclass(frozen=True)
class SmoothedLabels(TransformerConfig):
    """The transformer trainer's settings with one more."""

    label_smoothing: float = setting(0.0, "How much of each label is spread over the others.")


def test_the_trainjob_launcher_takes_the_one_pod_trainers_settings_after_its_own():
    """A setting added to the transformer trainer reaches the TrainJob launcher, after its
    own node settings, with no second edit; its help there points at the one-pod step's."""
    from components.train_transformer import component

    one = component.written_step(SmoothedLabels)
    launcher = component.written_trainjob(SmoothedLabels)
    names = list(inspect.signature(launcher).parameters)
    assert names.index("deadline_seconds") < names.index("model_name")
    assert names.index("label_smoothing") > names.index("deadline_seconds")
    assert inspect.signature(launcher).parameters["label_smoothing"].default == 0.0
    assert inspect.signature(one).parameters["label_smoothing"].default == 0.0
    assert "label_smoothing: How much of each label" in inspect.getdoc(one)
    doc = inspect.getdoc(launcher)
    assert "label_smoothing: As train_transformer_classifier's." in doc
    assert "batch_size: Texts per batch on each process." in doc
