"""Rules of the code's shape: steps meet only through contracts, defaults never drift."""

import ast
import dataclasses
import graphlib
import inspect
import pathlib
import re
import subprocess
import sys

import pytest

from components.evaluate_image import component as evaluate_image
from components.evaluate_text import component as evaluate_text
from components.prepare_text import component as prepare_text
from components.prepare_text.contract import SPLITS as TEXT_SPLITS
from components.prepare_text.contract import PrepareConfig, parse_label_columns
from components.register import component as register
from components.shard import component as shard
from components.shard.contract import SPLITS as IMAGE_SPLITS
from components.shard.contract import ShardConfig
from components.train_image import component as train_image
from components.train_image.contract import TrainConfig as ImageTrainConfig
from components.train_lm import component as train_lm
from components.train_lm.contract import LMConfig
from components.train_text import component as train_text
from components.train_text.contract import TrainConfig as TextTrainConfig
from components.train_text.contract import parse_model_config
from components.train_transformer import component as train_transformer
from components.train_transformer.contract import TransformerConfig
from pipelines.definitions import image, lm, text, transformer

ROOT = pathlib.Path(__file__).resolve().parent.parent / "components"
# What a contract or format must not load when imported (light steps import them).
HEAVY = ("tensorflow", "tf_keras", "torch", "fastai", "transformers", "kfp")
# What every step may import besides contracts: `common` (imports no step), `formats` (the
# readers and writers of steps' outputs) and `text_common` (what every text step shares).
SHARED = ("common", "formats", "text_common")
# Framework code in `common`, shared by the steps of one image, and those steps: it loads
# its framework when imported, so a light step (or a contract) importing it is not light.
FRAMEWORK_HOMES = {"components.common.fastai_text": ("train_text", "train_lm")}
# Neither text trainer imports the other (not even its contract); `text_common` neither.
TEXT_TRAINERS = ("train_text", "train_transformer")
# A module named in a string, as `importlib.import_module` takes it ("a.b" or "a.b:name").
MODULE_STRING = re.compile(r"components(\.[A-Za-z_]\w*)+(:[A-Za-z_]\w*)?")
# Cross-step imports the rule lets through, each with its reason.
ALLOWED = {
    # A tuning trial runs a trainer's KFP component in KFP's executor, as training does.
    ("tune/trial.py", "components.train_image.component"),
    ("tune/trial.py", "components.train_text.component"),
    ("tune/trial.py", "components.train_transformer.component"),
    # A trial's measurement is read as the tracking step reads the trainer's records.
    ("tune/measure.py", "components.track.tracking"),
    # The transformer step past one pod on Kubeflow runs a TrainJob (which imports no step).
    ("train_transformer/multinode.py", "components.trainjob.spec"),
    ("train_transformer/multinode.py", "components.trainjob.launcher"),
    # Node 0 stops the job once its launcher pod is gone (the launcher's `watch_owner`).
    ("train_transformer/node.py", "components.trainjob.launcher"),
}


def _imports(path: pathlib.Path) -> list[tuple[int, str]]:
    """(line, imported module) for every import in a file, in functions too; a string naming
    a module of components counts (`importlib.import_module`)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [f"{node.module}.{alias.name}" for alias in node.names]
            # `from components.shard import contract` imports the module components.shard.contract
            found += [(node.lineno, n if node.module.count(".") == 1
                       and node.module.startswith("components.") else node.module)
                      for n in names]
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str)
              and MODULE_STRING.fullmatch(node.value)):
            found.append((node.lineno, node.value.partition(":")[0]))
    return found


def _module_name(path: pathlib.Path) -> str:
    """A file's module name (a package's `__init__` is the package)."""
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _violations(path: pathlib.Path) -> list[str]:
    step = path.relative_to(ROOT).parts[0]
    problems = []
    for line, module in _imports(path):
        parts = module.split(".")
        if (parts[0] != "components" or len(parts) < 2
                or (path.relative_to(ROOT).as_posix(), module) in ALLOWED):
            continue
        other = parts[1]
        if step not in FRAMEWORK_HOMES.get(module, (step,)):
            problems.append(f"{path}:{line}: {step} imports {module}, another image's code")
        elif step == "common" and other != "common":
            problems.append(f"{path}:{line}: common imports {module}")
        elif step in (*TEXT_TRAINERS, "text_common") and other in TEXT_TRAINERS and other != step:
            problems.append(f"{path}:{line}: {step} imports the text trainer {module}")
        elif other not in (step, *SHARED) and parts[2:3] != ["contract"]:
            problems.append(f"{path}:{line}: {step} imports {module}, not {other}'s contract")
    return problems


def test_steps_import_each_other_only_through_contracts():
    paths = sorted(ROOT.rglob("*.py"))
    assert [p for path in paths for p in _violations(path)] == []
    # every exception is still taken (the tuning trial's by importlib strings)
    assert ALLOWED <= {(path.relative_to(ROOT).as_posix(), m) for path in paths
                       for _, m in _imports(path)}


@pytest.mark.parametrize("source, counts", [
    ("from components.train_image.training import MODEL_FILE\n"
     "def f():\n    from components.train_text import training\n"
     "from components.formats.shards import make_dataset\n"  # shared: allowed
     "TRAINERS = {'text': ('components.train_text.component', 'f')}\n"
     "def g():\n    return importlib.import_module('components.shard.sharding:x')\n"
     "USAGE = 'python -m components.shard.sharding'\n"  # not a module name
     "from components.common.fastai_text import quiet\n",  # the fastai trainers' only
     {"evaluate_image/evaluation.py": 5, "train_lm/training.py": 4}),
    ("from components.shard.contract import MANIFEST_NAME\n"  # a format reads contracts
     "from components.shard import records\n"
     "from components.formats import shards\n",
     {"formats/shards.py": 1, "common/storage.py": 3}),
    # neither text trainer imports the other, even its contract; text_common neither
    ("from components.train_text.contract import TrainConfig\n"
     "from components.train_transformer.contract import FRAMEWORK\n"
     "from components.text_common.contract import clip_text\n"  # shared: allowed
     "from components.prepare_text.contract import MULTI_LABEL\n",  # a contract: allowed
     {"train_transformer/training.py": 1, "train_text/training.py": 1,
      "text_common/models.py": 2, "evaluate_text/evaluation.py": 0}),
])
def test_the_contract_rule_catches_an_import_of_what_is_not_a_contract(monkeypatch, source,
                                                                        counts):
    monkeypatch.setattr(pathlib.Path, "read_text", lambda self: source)
    assert {path: len(_violations(ROOT / path)) for path in counts} == counts


def test_importing_every_contract_and_format_loads_no_framework():
    """Nor does what they import in turn (at module level: in a function it may)."""
    modules = [_module_name(path) for path in sorted(ROOT.glob("*/contract.py"))
               + sorted((ROOT / "formats").glob("*.py"))
               + sorted((ROOT / "text_common").glob("*.py"))]
    code = ("import importlib, sys\n"
            f"for m in {modules!r}: importlib.import_module(m)\n"
            f"print(sorted({{m.split('.')[0] for m in sys.modules}} & {set(HEAVY)!r}))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT.parent, check=True,
                         capture_output=True, text=True).stdout
    assert out.strip() == "[]"


def _defaults(function) -> dict:
    return {name: p.default for name, p in inspect.signature(function).parameters.items()
            if p.default is not inspect.Parameter.empty}


@pytest.mark.parametrize("pipeline, least", [(image.build("img:1"), 20),
                                             (text.build("img:1"), 20), (lm.build("img:1"), 12),
                                             (transformer.build("img:1"), 20)])
def test_pipeline_defaults_equal_the_defaults_of_the_steps_they_feed(pipeline, least):
    """Each pipeline parameter passed to a step has that step's own default."""
    spec = pipeline.pipeline_spec
    defaults = {name: p.default_value for name, p in
                spec.root.input_definitions.parameters.items()}
    checked = 0
    for task in spec.root.dag.tasks.values():
        component = spec.components[task.component_ref.name]
        own = component.input_definitions.parameters
        for name, source in task.inputs.parameters.items():
            pipeline_name = source.component_input_parameter
            if not pipeline_name or not own[name].HasField("default_value"):
                continue
            assert own[name].default_value == defaults[pipeline_name], (
                f"{task.task_info.name}.{name} defaults to {own[name].default_value}, the "
                f"pipeline's {pipeline_name} to {defaults[pipeline_name]}")
            checked += 1
    assert checked >= least


# Parameters the component turns into the config's value (0 means None).
NONE_FOR_ZERO = ("steps_per_epoch", "validation_steps")
PARSED = {"label_columns": parse_label_columns, "model_config": parse_model_config}


@pytest.mark.parametrize("component, config", [
    (shard.shard_images, ShardConfig),
    (train_image.train_image_classifier, ImageTrainConfig),
    (prepare_text.prepare_text_data, PrepareConfig),
    (train_text.train_text_classifier, TextTrainConfig),
    (train_lm.train_language_model, LMConfig),
    (train_transformer.train_transformer_classifier, TransformerConfig),
])
def test_component_defaults_equal_the_config_defaults(component, config):
    defaults = config()
    shared = sorted(set(_defaults(component)) & {f.name for f in dataclasses.fields(config)})
    assert len(shared) >= 5
    for name in shared:
        expected, value = getattr(defaults, name), _defaults(component)[name]
        if name in NONE_FOR_ZERO and expected is None:
            expected = 0
        if name in PARSED:
            value = PARSED[name](value)
        assert value == expected, f"{component.__name__}.{name}: {value!r} vs {expected!r}"


@pytest.mark.parametrize("component", [evaluate_image.evaluate_image_classifier,
                                       evaluate_text.evaluate_text_classifier,
                                       register.registration_gate])
def test_steps_without_a_config_have_documented_defaults(component):
    doc = inspect.getdoc(component)
    for name in _defaults(component):
        assert f"{name}:" in doc, f"{component.__name__}.{name} has no description"


def test_both_kinds_of_dataset_name_their_splits_alike():
    assert TEXT_SPLITS == IMAGE_SPLITS == ("train", "validation", "test")


def _module_graph(*packages: str) -> dict[str, set[str]]:
    """Module -> the modules of `packages` it imports, in functions too (`from pipelines
    import run_local` counts as pipelines.run_local)."""
    modules = {_module_name(path): path for package in packages
               for path in (ROOT.parent / package).rglob("*.py")}
    return {name: {m for m in _imported(path) if m in modules and m != name}
            for name, path in modules.items()}


def _imported(path: pathlib.Path) -> set[str]:
    """Every name a file imports, at module level or inside functions (`from a import b`:
    a and a.b, whichever is the module)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
    return found


def _cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import cycle of `graph` (its modules in import order), or [] when there is none."""
    try:  # sorted: the same cycle each run
        graphlib.TopologicalSorter({m: sorted(graph[m]) for m in sorted(graph)}).prepare()
    except graphlib.CycleError as err:
        return err.args[1][::-1]  # the sorter's edges point from the imported module
    return []


# The layers, lowest first: each imports only layers below it (and itself). The product
# (what the wheel and the images hold) imports nothing of the workshop; the rehearsal and
# the data makers never import each other. A module's layer: the longest key prefixing it.
LAYERS = {"components": 0, "pipelines": 1, "compile": 2, "tools.rehearsal": 3,
          "tools.datamakers": 3, "tools": 4, "bench": 5}
PRODUCT = ("components", "pipelines", "compile")


def _layer(module: str) -> str | None:
    """The key of LAYERS a module belongs to, or None."""
    keys = [k for k in LAYERS if module == k or module.startswith(k + ".")]
    return max(keys, key=len) if keys else None


def _layer_files() -> dict[str, list[pathlib.Path]]:
    """Layer -> its source files (a file of tools/rehearsal is tools.rehearsal's, not tools')."""
    root = ROOT.parent
    found: dict[str, list[pathlib.Path]] = {}
    for path in sorted([root / "compile.py", *(f for top in ("components", "pipelines", "tools",
                                                             "bench")
                                               for f in (root / top).rglob("*.py"))]):
        found.setdefault(_layer(_module_name(path)), []).append(path)
    return found


def test_the_pipelines_and_tools_import_no_circle_and_definitions_nothing_beside_them():
    """Deferred imports inside functions count: a circle is a circle whenever it closes.
    Tools import the definitions (what compile.py builds); these import steps only."""
    graph = _module_graph("pipelines", "tools")
    definitions = {m for m in graph if m.startswith("pipelines.definitions")}
    assert {"pipelines.definitions.image", "pipelines.definitions.vertex"} <= definitions
    assert {m: sorted(graph[m] - definitions) for m in definitions if graph[m] - definitions} \
        == {}
    assert "pipelines.local_run" in graph["pipelines.tune_local"]
    assert _cycle(graph) == []
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    # `from pipelines import run_local` inside a function is an edge too
    assert "pipelines.tune_local" in graph["pipelines.run_local"]
    assert "tools.rehearsal.spec" in graph["tools.rehearsal.driver"]  # across packages too
    assert "pipelines.catalogue" in graph["tools.rehearsal.records"]
    assert "tools.datamakers.font_glyphs" in graph["tools.datamakers.glyph_start"]


def _component_packages(root: pathlib.Path = ROOT) -> dict[str, set[str]]:
    """components.<package> -> the other packages of components it imports (as `_imports`
    sees them)."""
    graph: dict[str, set[str]] = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).parts
        if len(parts) > 1:
            package = f"components.{parts[0]}"
            graph.setdefault(package, set()).update(
                ".".join(m.split(".")[:2]) for _, m in _imports(path)
                if m.startswith("components."))
    return {package: imported & set(graph) - {package} for package, imported in graph.items()}


def test_the_packages_of_components_import_no_circle():
    """The contract rule lets a step import `formats` and a format a step's contract: a
    circle it cannot see, checked here by package and by module."""
    graph = _component_packages()
    assert "components.train_text" in graph["components.tune"]  # an importlib string
    assert "components.formats" in graph["components.preflight"]  # inside a function
    assert _cycle(graph) == []
    assert _cycle(_module_graph("components")) == []


def test_the_package_circle_check_sees_a_format_importing_its_users_contract(monkeypatch):
    real = pathlib.Path.read_text
    monkeypatch.setattr(pathlib.Path, "read_text", lambda self: real(self) + (
        "def f():\n    from components.train_text.contract import TrainConfig\n"
        if self == ROOT / "formats" / "lm_assets.py" else ""))
    assert _violations(ROOT / "formats" / "lm_assets.py") == []  # a contract: allowed
    assert _cycle(_component_packages()) == [
        "components.formats", "components.train_text", "components.formats"]


def _package_imports(path: pathlib.Path) -> set[str]:
    """The layers a file imports (`_imported`)."""
    return {_layer(module) for module in _imported(path)} - {None}


def _layer_violations() -> list[tuple[str, str, str]]:
    """(file, its layer, the layer it imports) for every import of a layer beside or above
    the file's own."""
    return [(path.relative_to(ROOT.parent).as_posix(), layer, other)
            for layer, paths in _layer_files().items() if layer
            for path in paths
            for other in sorted(_package_imports(path) - {layer})
            if LAYERS[other] >= LAYERS[layer]]


def test_packages_import_only_the_layers_below_them():
    root = ROOT.parent
    assert _layer_violations() == []
    files = _layer_files()
    assert root / "compile.py" in files["compile"]
    assert root / "tools" / "local_build.py" in files["tools"]
    assert root / "tools" / "rehearsal" / "records.py" in files["tools.rehearsal"]
    assert _package_imports(root / "tools" / "rehearsal" / "records.py") >= {
        "components", "pipelines"}
    assert _package_imports(root / "tools" / "datamakers" / "glyph_start.py") >= {
        "components", "pipelines"}


def test_the_layer_rule_catches_an_import_upward_or_sideways(monkeypatch):
    monkeypatch.setattr(pathlib.Path, "read_text", lambda self: (
        "from components.common.storage import filesystem\n"
        "def f():\n    import tools.rehearsal.gcs_api\n"
        "from tools.datamakers import demo_text\n"
        "from tools import local_build\n"
        "import pipelines.params as params\n"))
    seen = {(layer, other) for _, layer, other in _layer_violations()}
    workshop = ("tools.rehearsal", "tools.datamakers", "tools")
    # every layer of the product importing each of the workshop; the steps the pipelines
    product = {(low, high) for low in PRODUCT for high in workshop} | {("components", "pipelines")}
    rehearsal_or_data = {("tools.rehearsal", "tools.datamakers"), ("tools.rehearsal", "tools"),
                         ("tools.datamakers", "tools.rehearsal"), ("tools.datamakers", "tools")}
    assert seen == product | rehearsal_or_data


def test_every_documented_module_command_names_a_module():
    """`python -m X` in the README, the docs and the Makefile: X is there to run."""
    import importlib.util

    root = ROOT.parent
    texts = [root / "README.md", root / "Makefile", *sorted((root / "docs").glob("*.md"))]
    named = {m for path in texts
             for m in re.findall(r"python3? -m ([A-Za-z_][\w.]*\w)", path.read_text())}
    assert {"pipelines.run_local", "tools.rehearsal", "tools.datamakers.demo"} <= named
    assert sorted(m for m in named if importlib.util.find_spec(m) is None) == []


def test_the_wheel_and_the_images_hold_the_product_alone():
    """What pip installs and what the Dockerfiles copy: none of the workshop."""
    import tomllib

    import setuptools

    root = ROOT.parent
    config = tomllib.loads((root / "pyproject.toml").read_text())
    found = setuptools.find_packages(
        str(root), include=config["tool"]["setuptools"]["packages"]["find"]["include"])
    assert {"components", "pipelines", "pipelines.definitions", "components.shard"} <= set(found)
    assert {_layer(package) for package in found} == {"components", "pipelines"}
    for dockerfile in (root / "containers").glob("*/Dockerfile"):
        copied = re.findall(r"^COPY (?:--\S+ )*(\S+)", dockerfile.read_text(), re.M)
        sources = {c.rstrip("/") for c in copied}
        assert {"components", "pipelines", "compile.py"} <= sources, dockerfile
        layers = {_layer(s.replace("/", ".").removesuffix(".py")) for s in sources} - {None}
        assert layers <= set(PRODUCT), dockerfile


# Our own packages: a private name of a module of theirs stays in that module (the tests
# may reach in). Other libraries' private names: `_borrowed_names` below.
OURS = ("components", "pipelines")


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _root_name(node: ast.AST) -> str | None:
    """The name an attribute chain starts from (`a` of `a.b.c`), or None."""
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _private_uses(path: pathlib.Path) -> list[str]:
    """Where a file reaches into another module of ours for a private name: `from
    components.x import _y` (relative ones resolved), and `m._y`, `m.n._y` where `m` is a
    name the file bound by importing something of ours. Its own module's names do not count.
    """
    tree = ast.parse(path.read_text())
    own = _module_name(path)
    package = own.split(".") if path.name == "__init__.py" else own.split(".")[:-1]
    bound: set[str] = set()  # local names of what the file imported from our packages
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            bound |= {alias.asname or alias.name.split(".")[0] for alias in node.names
                      if alias.name.split(".")[0] in OURS}
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            if module.split(".")[0] not in OURS:
                continue
            for alias in node.names:
                if not _private(alias.name):
                    bound.add(alias.asname or alias.name)
                elif module != own:
                    found.append(f"{path}:{node.lineno}: from {module} import {alias.name}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr) and (
                _root_name(node.value) in bound):
            found.append(f"{path}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_module_of_components_uses_another_modules_private_names():
    problems = [p for path in sorted(ROOT.rglob("*.py")) for p in _private_uses(path)]
    assert problems == []


def test_the_private_name_rule_catches_imports_and_attributes_not_third_party(monkeypatch):
    monkeypatch.setattr(pathlib.Path, "read_text", lambda self: (
        "from components.preflight.parameters import PreflightError, _number, _steps\n"
        "from components.train_text import runner\n"
        "import components.shard.output_folder as folder\n"
        "import components.common.storage\n"
        "from . import _sibling\n"  # components.train_text._sibling
        "from .data import _frame, _VALID\n"  # its own module's names
        "def f(self):\n"
        "    from components.preflight import parameters as p\n"
        "    return (runner._reset_folder, folder._OWN_FILE.match, p._x,\n"
        "            components.common.storage._gcs_options, self._y, runner.__name__)\n"
        "from fastai.text.learner import _get_text_vocab\n"  # third-party: allowed
        "from kfp.dsl.types import artifact_types\n"
        "PREFIX = artifact_types._GCS_LOCAL_MOUNT_PREFIX\n"))  # third-party: allowed
    found = _private_uses(ROOT / "train_text" / "data.py")
    assert sorted(line.split(": ", 1)[1] for line in found) == [
        "components.common.storage._gcs_options", "folder._OWN_FILE",
        "from components.preflight.parameters import _number",
        "from components.preflight.parameters import _steps",
        "from components.train_text import _sibling", "p._x", "runner._reset_folder"]


# Other libraries' private names only in BORROWED, which says why no public way exists
# (tests/test_borrowed.py). A private name no product module defines is another library's.
BORROWED = ROOT / "common" / "borrowed.py"
PUBLIC_UNDERSCORED = {"_exit", "_fields", "_replace", "_asdict", "_make"}  # os's, namedtuple's


def _borrowed_names(sources: dict[pathlib.Path, str]) -> list[str]:
    """Where `sources` (the whole product) use a private name it does not define."""
    nodes = [(path, node) for path, text in sources.items() for node in ast.walk(ast.parse(text))]
    ours = PUBLIC_UNDERSCORED | {
        getattr(node, "name", None) or getattr(node, "id", None) or node.attr
        for _, node in nodes
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
        or isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store)
        or isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
        and getattr(node.value, "id", "") in ("self", "cls")}
    found = []
    for path, node in nodes:
        names = ([node.attr] if isinstance(node, ast.Attribute) else
                 [alias.name for alias in node.names] if isinstance(node, ast.ImportFrom) else
                 [arg.value for arg in node.args[1:2] if isinstance(arg, ast.Constant)]
                 if isinstance(node, ast.Call) and getattr(node.func, "id", "") in (
                     "getattr", "hasattr", "setattr", "delattr") else [])
        found += [f"{path}:{node.lineno}: {name}" for name in names
                  if isinstance(name, str) and _private(name) and name not in ours]
    return found


def test_the_product_uses_other_libraries_private_names_in_borrowed_only():
    paths = [path for layer in PRODUCT for path in _layer_files().get(layer, [])]
    found = _borrowed_names({path: path.read_text() for path in paths})
    assert [line for line in found if not line.startswith(f"{BORROWED}:")] == []


def test_the_borrowed_name_rule_catches_attributes_imports_and_getattr():
    found = _borrowed_names({pathlib.Path("m.py"): (
        "from fastai.text.learner import _get_text_vocab\n"
        "from components.common.storage import _gcs_options\n"  # ours: the rule above
        "def _gcs_options(): pass\n"
        "class Job:\n"
        "    _kind = 1\n"
        "    def f(self, job, threading, os, row):\n"
        "        self._ours, job._set = job._gca_resource, 1\n"
        "        return (getattr(threading, '_register_atexit'), self._ours, self._kind,\n"
        "                os._exit, row._replace)\n")})
    assert sorted(line.split(": ")[1] for line in found) == [
        "_gca_resource", "_get_text_vocab", "_register_atexit", "_set"]


# Rooms a reader can hold (the tests are not held to them): 800 lines a file lets a step
# read in a few files (500 cut steps into ten). Functions are not sized: a limit there only
# split them into helpers a reader follows one by one.
MAX_FILE_LINES = 800
UNSIZED = ("tests", ".venv", "runs")


def _sources(root: pathlib.Path) -> list[pathlib.Path]:
    """The project's Python files below `root`, but UNSIZED or hidden folders'."""
    found = []
    for top in sorted(root.iterdir()):
        if top.name in UNSIZED or top.name.startswith("."):
            continue
        found += [top] if top.suffix == ".py" else sorted(top.rglob("*.py")) if top.is_dir() else []
    return found


def test_no_source_file_is_over_the_file_limit():
    sources = _sources(ROOT.parent)
    assert ROOT / "common" / "metrics.py" in sources and ROOT.parent / "compile.py" in sources
    assert not [p for p in sources if "tests" in p.relative_to(ROOT.parent).parts]
    long = [f"{p}: {n} lines" for p in sources if (n := len(p.read_text().splitlines()))
            > MAX_FILE_LINES]
    assert long == []


def _library_patches(path: pathlib.Path) -> list[str]:
    """Where a file assigns, sets or deletes an attribute reached through another library's
    import (`yaml.safe_load = ...`, `setattr(kfp.dsl, ...)`); ours and its variables do not
    count."""
    tree = ast.parse(path.read_text())
    libraries: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            libraries |= {alias.asname or alias.name.split(".")[0] for alias in node.names
                          if alias.name.split(".")[0] not in OURS}
        elif isinstance(node, ast.ImportFrom) and not node.level and (
                node.module.split(".")[0] not in OURS):
            libraries |= {alias.asname or alias.name for alias in node.names}
    found = []
    for node in ast.walk(tree):
        targets = (node.targets if isinstance(node, (ast.Assign, ast.Delete)) else
                   [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else [])
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and (
                node.func.id in ("setattr", "delattr")) and node.args:
            targets = [ast.Attribute(value=node.args[0], attr="?")]
        while any(isinstance(target, (ast.Tuple, ast.List)) for target in targets):
            targets = [t for target in targets for t in (
                target.elts if isinstance(target, (ast.Tuple, ast.List)) else [target])]
        found += [f"{path}:{node.lineno}: {ast.unparse(target)}" for target in targets
                  if isinstance(target, ast.Attribute) and _root_name(target) in libraries]
    return found


def test_the_product_patches_no_other_library():
    """A swapped function is seen by every caller, is not thread-safe, and an upgrade breaks
    it silently (issue 58 swapped kfp's `pipeline_task.inspect` and PyYAML's `safe_*`)."""
    files = [path for layer in PRODUCT for path in _layer_files().get(layer, [])]
    assert len(files) > 100
    assert [hit for path in files for hit in _library_patches(path)] == []


def test_the_patch_rule_catches_assigning_to_a_librarys_attribute(tmp_path):
    source = tmp_path / "patched.py"
    source.write_text("import yaml\nfrom kfp.dsl import pipeline_task\n"
                      "from components.common import storage\nimport os\n\n"
                      "def f(x):\n    pipeline_task.inspect = x\n    yaml.safe_load = x\n"
                      "    setattr(yaml, 'safe_dump', x)\n    storage.CACHE = x\n"
                      "    os.environ['A'] = '1'\n    x.y = 1\n"
                      "    yaml.safe_load, (yaml.safe_dump, y) = x\n")
    hits = _library_patches(source)
    assert sorted(hit.split(": ", 1)[1] for hit in hits) == [
        "pipeline_task.inspect", "yaml.?", "yaml.safe_dump", "yaml.safe_load", "yaml.safe_load"]
