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
from tools import signatures

ROOT = Path(__file__).resolve().parents[1]
PIPELINES = tuple(f"pipelines.definitions.{kind}"
                  for kind in ("image", "text", "transformer", "lm"))


def test_every_written_signature_is_current(capsys):
    assert signatures.main(["--check"]) == 0, capsys.readouterr().out


def test_a_value_already_right_keeps_its_spelling_and_a_stale_one_is_rewritten():
    source = "def f(\n    a: float = 1e-3,\n    b: int = 2,\n    c: str = 'x',\n):\n    pass\n"
    assert signatures.rewrite_defaults(source, "f", {"a": 0.001, "b": 2}) == source
    assert signatures.rewrite_defaults(source, "f", {"b": 5, "c": "y"}) == (
        "def f(\n    a: float = 1e-3,\n    b: int = 5,\n    c: str = \"y\",\n):\n    pass\n")
    # 1 is not 1.0 to KFP (an int literal makes an integer default): the type counts too
    assert "a: float = 1.0" in signatures.rewrite_defaults(source, "f", {"a": 1.0})


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


def test_a_parameter_list_is_copied_whole_and_built_values_become_empty():
    pipeline = ("def build(x):\n    def p(\n        data_uri: str,\n        seed: int = 42,\n"
                "        account: str = x,\n    ):\n        pass\n")
    lines = signatures.parameter_lines(pipeline, "p")
    assert lines == ["    data_uri: str,", "    seed: int = 42,", '    account: str = "",']
    step = "def check(\n    data_uri: str,\n    old: int = 1,\n) -> str:\n    return ''\n"
    assert signatures.rewrite_parameters(step, "check", lines) == (
        "def check(\n    data_uri: str,\n    seed: int = 42,\n    account: str = \"\",\n"
        ") -> str:\n    return ''\n")


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


# learning_rate's help in each function that declares it, and the trainer whose rule it is.
LEARNING_RATE_HELP = (
    ("components.train_text.component", "train_text_classifier", "text"),
    ("components.train_lm.component", "train_language_model", "lm"),
)


def _described(module: str, name: str, image: str = "img:1") -> str:
    """The help of pipeline parameter `name` as its build describes it (the console's)."""
    import importlib

    spec = importlib.import_module(module).build(image).pipeline_spec
    return spec.root.input_definitions.parameters[name].description


def _help(module: str, function: str, name: str, source: str | None = None) -> str:
    import ast

    source = source or signatures._source_path(module).read_text()
    doc = ast.get_docstring(signatures._function(ast.parse(source), function))
    (line,) = [text.strip() for text in doc.splitlines() if text.strip().startswith(name + ":")]
    return line


def test_learning_rate_help_names_the_rule_and_bounds_the_code_uses():
    """learning_rate=0: fastai's valley, held to each trainer's bounds (choose_rate)."""
    from components.train_lm import training as lm_training
    from components.train_text import schedule

    def rate(value: float) -> str:
        return signatures.rate_text(value)

    bounds = {
        "text": (rate(schedule.MIN_FOUND_LR), rate(schedule.MAX_FOUND_LR_WHOLE),
                 rate(schedule.MAX_FOUND_LR_HEAD), str(schedule.BOUNDS_N_HID)),
        "lm": (f"{rate(lm_training.MIN_FOUND_LR)}..{rate(lm_training.MAX_FOUND_LR)}",),
    }
    for module, function, kind in LEARNING_RATE_HELP:
        line = _help(module, function, "learning_rate")
        assert "valley" in line and "steep" not in line and "minimum" not in line, line
        for text in bounds[kind]:
            assert text in line, (module, text)
        pipeline = f"pipelines.definitions.{kind}"  # the pipeline says its trainer's help
        assert f"learning_rate: {_described(pipeline, 'learning_rate')}" == line


def test_the_learning_rate_sentence_is_written_from_beside_choose_rate():
    """Changing the sentence next to choose_rate is one edit: the generator writes the rest."""
    home = "components.common.fastai_text"
    sources = {m: signatures._source_path(m).read_text() for m in signatures._modules()}
    assert home in sources
    old = 'FOUND_RATE_HELP = ("0 finds it'
    assert old in sources[home]
    sources[home] = sources[home].replace(old, 'FOUND_RATE_HELP = ("0 asks lr_find: it')
    wanted = signatures.written(sources)
    changed = {m for m in sources if wanted[m] != sources[m]}
    assert changed == {m for m, _, _ in LEARNING_RATE_HELP}
    for module, function, _ in LEARNING_RATE_HELP:
        line = _help(module, function, "learning_rate", wanted[module])
        assert "; 0 asks lr_find: it" in line and "0 finds it" not in line


def test_every_written_function_is_marked_above_its_def_and_decorators():
    """The comment stands above the decorators, in the def's indentation; a stale one is
    replaced, not doubled; one already right leaves the text as it is."""
    marker = "# Defaults written by python -m tools.signatures from here (edit there)."
    source = ("def build(x):\n    @dsl.pipeline(\n        name='p')\n    def p(\n"
              "        a: int = 1,\n    ):\n        pass\n")
    marked = signatures.mark(source, "p", marker)
    assert marked == source.replace("    @dsl", f"    {marker}\n    @dsl")
    assert signatures.mark(marked, "p", marker) == marked
    moved = marker.replace("from here", "from there")
    assert signatures.mark(marked, "p", moved) == source.replace("    @dsl",
                                                                 f"    {moved}\n    @dsl")
    step = "import x\n\n\n# a comment of its own\ndef f(\n    a: int = 1,\n):\n    pass\n"
    assert signatures.mark(step, "f", marker) == step.replace("def f", f"{marker}\ndef f")


def test_the_mark_stays_out_of_the_source_kfp_pastes():
    """KFP pastes a step's function from its def on: the compiled JSON never holds the mark."""
    from components.shard import component as shard

    for function in (shard.shard_images,):
        lines, first = inspect.getsourcelines(function)
        assert signatures.MARKED not in "".join(lines)
        above = inspect.getsource(inspect.getmodule(function)).splitlines()[first - 2]
        assert signatures.MARKED in above


def test_a_two_line_mark_is_replaced_whole_and_an_own_comment_above_it_stays():
    marker = "# Defaults written by python -m tools.signatures from\n# here (edit there)."
    source = "# my own\ndef f(\n    a: int = 1,\n):\n    pass\n"
    marked = signatures.mark(source, "f", marker)
    assert marked == source.replace("def f", f"{marker}\ndef f")
    assert signatures.mark(marked, "f", marker) == marked
    one_line = "# Defaults written by python -m tools.signatures from there (edit there)."
    assert signatures.mark(marked, "f", one_line) == source.replace("def f",
                                                                    f"{one_line}\ndef f")


def test_a_steps_help_reaches_the_pipelines_it_feeds(monkeypatch):
    """Changing a step's Args entry is one edit: its pipelines describe the parameter so."""
    from components.prepare_text import component as prepare_text

    step = prepare_text.prepare_text_data
    old = "text_column: Name of the column holding the texts."
    assert old in step.__doc__
    monkeypatch.setattr(step, "__doc__", step.__doc__.replace(old, "text_column: Texts."))
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


def test_the_trainjob_launcher_takes_the_one_pod_trainers_parameters_as_written():
    """A setting added to the transformer trainer reaches the TrainJob launcher, after its
    own node settings, with no second edit."""
    module = "components.train_transformer.component"
    sources = {m: signatures._source_path(m).read_text() for m in signatures._modules()}
    sources[module] = sources[module].replace(
        '    hypertune_metric: str = "",\n):\n    """Fine-tunes a pretrained',
        '    hypertune_metric: str = "",\n    label_smoothing: float = 0.0,\n):\n'
        '    """Fine-tunes a pretrained', 1)
    launcher = signatures.written(sources)[module]
    launcher = launcher[launcher.index("def train_transformer_trainjob"):]
    head = launcher[:launcher.index("):")]
    assert head.index("deadline_seconds: int,") < head.index("model_name: str")
    assert head.rstrip().endswith("label_smoothing: float = 0.0,")
