"""The registration gate and the serving model handed to the Model Registry upload."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from components.common.metrics import read_evaluation, single_label_metrics, write_outputs
from components.register.registration import (
    STARTUP_ALLOWANCE_S,
    container_spec,
    copy_serving_model,
    find_model,
    gate,
    model_labels,
)

# metrics.json as the single-label evaluator writes it: numbers next to strings,
# lists, nested dicts and a null (roc_auc when the data holds one class only).
METRICS = {
    "task": "single_label",
    "num_examples": 40,
    "classes": ["cat", "dog"],
    "accuracy": 0.8,
    "macro_f1": 0.65,
    "weighted_f1": 0.7,
    "positive_class": "dog",
    "roc_auc": None,
    "per_class": {"cat": {"f1": 0.9, "support": 20}, "dog": {"f1": 0.4, "support": 20}},
    "confusion_matrix": {"labels": ["cat", "dog"], "matrix": [[18, 2], [6, 14]]},
}


# --- gate: the decision -------------------------------------------------------------

JUST_BELOW = math.nextafter(0.8, 0.0)


@pytest.mark.parametrize("changes, metric, threshold, register, reason", [
    ({}, "accuracy", 0.8, True, "accuracy = 0.8 >= 0.8: registering"),
    # the exact value, not one rounded up to the threshold it missed
    ({"accuracy": JUST_BELOW}, "accuracy", 0.8, False,
     f"accuracy = {JUST_BELOW!r} < 0.8: not registering"),
    ({"accuracy": 0.0}, "accuracy", 0.0, True, None),  # a threshold of 0 registers anything
    ({"accuracy": 1.0}, "accuracy", 1.0, True, None),  # a perfect model clears the strictest
    ({"accuracy": 0.999}, "accuracy", 1.0, False, None),
    # the named metric and no other
    ({"accuracy": 0.95, "macro_f1": 0.6}, "accuracy", 0.9, True, None),
    ({"accuracy": 0.95, "macro_f1": 0.6}, "macro_f1", 0.9, False,
     "macro_f1 = 0.6 < 0.9: not registering"),
    ({"accuracy": 1}, "accuracy", 0.8, True, "accuracy = 1 >= 0.8: registering"),  # an int
    ({"macro_f1": 0.91234}, "macro_f1", 0.9, True, "macro_f1 = 0.91234 >= 0.9: registering"),
])
def test_decision_is_metric_at_least_threshold_and_says_its_numbers(
        changes, metric, threshold, register, reason):
    decided, said = gate({**METRICS, **changes}, metric, threshold)
    assert decided is register
    assert said == reason or reason is None


@pytest.mark.parametrize("linear, register", [(0.79, True), (0.8, False), (0.85, False)])
def test_beat_baselines_requires_the_metric_above_every_baseline(linear, register):
    metrics = {**METRICS, "baseline": {"pixels_logreg": {"accuracy": linear},
                                       "majority_class": {"accuracy": 0.5}}}
    decided, reason = gate(metrics, "accuracy", 0.7, beat_baselines=True)
    assert decided is register, reason
    assert ("pixels_logreg" in reason) is not register
    # off (the default), the baselines do not count
    assert gate(metrics, "accuracy", 0.7)[0] is True


def test_beat_baselines_without_baselines_does_not_register():
    decided, reason = gate(dict(METRICS), "accuracy", 0.7, beat_baselines=True)
    assert decided is False and "no baseline" in reason


@pytest.mark.parametrize("value, threshold", [(1.0, 0.0), (0.8, 0.8), (0.0, 0.9)])
def test_disabled_never_registers(value, threshold):
    register, reason = gate({**METRICS, "accuracy": value}, "accuracy", threshold,
                             enabled=False)
    assert register is False
    assert "switched off" in reason
    assert "registering" not in reason.replace("registration", "")


# --- gate: metrics it cannot compare ------------------------------------------------


def test_unknown_metric_is_an_error_listing_the_numeric_metrics():
    with pytest.raises(ValueError) as err:
        gate(dict(METRICS), "f1_score", 0.5)
    message = str(err.value)
    assert "'f1_score'" in message
    # every top-level number is offered, and nothing that is not one
    assert "['accuracy', 'macro_f1', 'num_examples', 'weighted_f1']" in message


@pytest.mark.parametrize("metrics, metric, threshold, enabled, words", [
    # a misspelt setting is reported on the run that has it, registration off or on
    (METRICS, "acuracy", 0.5, False, "'acuracy'"),
    ({"accuracy": float("inf")}, "accuracy", 0.8, True, "not a finite number"),
    ({"accuracy": float("-inf")}, "accuracy", 0.8, True, "not a finite number"),
    (METRICS, "accuracy", float("nan"), True, r"threshold must be in \[0, 1\], got nan"),
    # the preflight's rule, held by the gate itself
    (METRICS, "accuracy", 1.5, False, r"registration_threshold must be in \[0, 1\], got 1.5"),
    ({}, "accuracy", 0.5, True, r"choose one of \[\]"),
    # a score that is not a number: roc_auc of a one-class evaluation, a number written as
    # a string, a bool (Python counts it as an int), nan, nested (e.g. per_class), a list
    *[({"accuracy": 0.9, "score": value}, "score", 0.5, True,
       r"registration metric 'score' .*\['accuracy'")
      for value in (None, "0.9", True, float("nan"), {"f1": 0.9}, [0.9])],
], ids=["unknown-when-off", "inf", "-inf", "nan-threshold", "threshold-above-1", "empty",
        "null", "string", "bool", "nan", "dict", "list"])
def test_what_the_gate_cannot_compare_is_an_error(metrics, metric, threshold, enabled, words):
    with pytest.raises(ValueError, match=words):
        gate(dict(metrics), metric, threshold, enabled=enabled)


# --- read_evaluation -------------------------------------------------------------------


def test_read_metrics_names_a_missing_metrics_json_and_refuses_broken_json(tmp_path):
    with pytest.raises(FileNotFoundError, match="metrics.json"):
        read_evaluation(str(tmp_path))
    (tmp_path / "metrics.json").write_text('{"accuracy": 0.9,')  # a truncated write
    with pytest.raises(ValueError):
        read_evaluation(str(tmp_path))


def test_gate_on_what_the_evaluator_writes(tmp_path):
    """metrics.json from the evaluator's own writer, read back and gated."""
    import numpy as np

    y_true = np.array([0, 0, 1, 1])
    y_prob = np.array([[0.9, 0.1], [0.2, 0.8], [0.3, 0.7], [0.4, 0.6]])  # 3 of 4 right
    write_outputs(single_label_metrics(y_true, y_prob, ["cat", "dog"]), str(tmp_path), "")
    metrics = read_evaluation(str(tmp_path))
    assert gate(metrics, "accuracy", 0.75) == (True, "accuracy = 0.75 >= 0.75: registering")
    assert gate(metrics, "accuracy", 0.76)[0] is False


# --- copy_serving_model -------------------------------------------------------------

SAVED_MODEL = {
    "saved_model.pb": b"\x08\x01\x12\x00protobuf",
    "fingerprint.pb": b"\x00\x01\x02",
    "variables/variables.index": b"index\x00\xff",
    "variables/variables.data-00000-of-00001": bytes(range(256)) * 64,
    "assets/vocab/labels.txt": b"cat\ndog\n",
}
NOT_SERVED = {
    "checkpoints/ckpt-3.index": b"checkpoint",
    "metrics.json": b"{}",
    "history.csv": b"epoch,loss\n",
}


def _write(root, files: dict[str, bytes]) -> None:
    for relative, data in files.items():
        path = Path(root, relative)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def _tree(root) -> dict[str, bytes]:
    return {path.relative_to(root).as_posix(): path.read_bytes()
            for path in Path(root).rglob("*") if path.is_file()}


def _model(tmp_path, subdir: str = "saved_model") -> str:
    model = tmp_path / "model"
    _write(model / subdir, SAVED_MODEL)
    _write(model, NOT_SERVED)
    (model / subdir / "empty_assets").mkdir()
    return str(model)


@pytest.mark.parametrize("subdir, out_holds", [
    ("saved_model", None), ("export/serving", None), ("saved_model", {}),
    ("saved_model", {"variables/stale.index": b"a retried attempt's file"})],
    ids=["new output folder", "nested subdir", "output folder made by KFP",
         "an earlier attempt's files"])
def test_copies_exactly_the_savedmodel_folder_into_a_new_or_emptied_output_folder(
        tmp_path, subdir, out_holds):
    model = _model(tmp_path, subdir=subdir)
    out = tmp_path / "artifact" / "unmanaged_model"  # its parent does not exist yet
    if out_holds is not None:  # KFP may create the output folder before the step runs
        out.mkdir(parents=True)
        _write(out, out_holds)
    copy_serving_model(model, subdir, str(out))
    # the folder's contents at the top of out, not out/saved_model; same bytes; nothing else
    assert _tree(out) == SAVED_MODEL and (out / "empty_assets").is_dir()
    # the model folder is left as it was
    assert _tree(model) == {**{f"{subdir}/{k}": v for k, v in SAVED_MODEL.items()}, **NOT_SERVED}


@pytest.mark.parametrize("has_model, subdir, words", [
    (True, "savedmodel", "'savedmodel'"),
    (True, "metrics.json", "metrics.json"),  # a file
    (False, "saved_model", "no 'saved_model' to serve"),
])
def test_a_subdir_that_is_no_folder_is_a_clear_error_and_writes_nothing(tmp_path, has_model,
                                                                       subdir, words):
    model = _model(tmp_path) if has_model else str(tmp_path / "no-model")
    out = tmp_path / "out"
    with pytest.raises(FileNotFoundError) as err:
        copy_serving_model(model, subdir, str(out))
    assert str(Path(model, subdir)) in str(err.value)
    assert words in str(err.value)
    assert not out.exists()


@pytest.mark.parametrize("subdir", ["", "/etc", "../other"])
def test_subdir_must_be_inside_the_model(tmp_path, subdir):
    with pytest.raises(ValueError, match="subdir must be a folder inside the model"):
        copy_serving_model(_model(tmp_path), subdir, str(tmp_path / "out"))


# ------------------------------------------------------------------ versions and labels


def test_labels_name_the_run_data_and_code_within_vertex_rules():
    labels = model_labels("Image-Classifier 2026/11/22", {
        "data_sha256": "AB" * 32, "git_sha": "0123456789abcdef" * 2 + "01234567"})
    assert labels == {"pipeline_run": "image-classifier-2026-11-22",
                      "data_sha256": "abababababababab", "git_sha": "0123456789ab"}
    assert model_labels("r" * 80, {"git_sha": "unknown"}) == {"pipeline_run": "r" * 63}


def test_find_model_asks_the_registry_for_the_display_name(monkeypatch):
    """The Model Service's ListModels stub is replaced (Vertex cannot exist here); the
    request is built by the real SDK."""
    from google.auth.credentials import AnonymousCredentials
    from google.cloud.aiplatform_v1.services.model_service.transports.grpc import (
        ModelServiceGrpcTransport,
    )
    from google.cloud.aiplatform_v1.types import ListModelsResponse, Model

    from tests.test_submit import _Rpc

    parent = "projects/p/locations/europe-west4"
    registry = {'display_name="pets \\"v2\\""': [f"{parent}/models/9", f"{parent}/models/3"]}
    rpc = _Rpc(lambda request: ListModelsResponse(models=[
        Model(name=name, display_name="pets") for name in registry.get(request.filter, [])]))
    monkeypatch.setattr(ModelServiceGrpcTransport, "list_models", property(lambda self: rpc))
    found = find_model('pets "v2"', "p", "europe-west4", credentials=AnonymousCredentials())
    assert found == f"{parent}/models/9"  # the most recently updated one
    (request,) = rpc.requests
    assert request.parent == parent and request.order_by == "update_time desc"
    assert find_model("cats", "p", "europe-west4", credentials=AnonymousCredentials()) is None


def test_gate_component_shows_its_decision(tmp_path):
    from types import SimpleNamespace

    from components.register.component import registration_gate

    evaluation = tmp_path / "evaluation"
    evaluation.mkdir()
    (evaluation / "metrics.json").write_text(json.dumps({"accuracy": 0.75}))
    decision = SimpleNamespace(path=str(tmp_path / "decision.md"), metadata={})
    assert registration_gate(SimpleNamespace(path=str(evaluation)), decision, "accuracy",
                             0.8) is False
    assert (tmp_path / "decision.md").read_text() == (
        "# Model Registry: not registered\n\naccuracy = 0.75 < 0.8: not registering\n")
    assert decision.metadata == {"register": False, "metric": "accuracy", "threshold": 0.8,
                                 "reason": "accuracy = 0.75 < 0.8: not registering",
                                 "beat_baselines": False}


def test_whole_model_folder_can_be_served(tmp_path):
    fastai_model = {"export.pkl": b"learner", "labels.json": b"{}"}
    _write(tmp_path / "model", fastai_model)
    copy_serving_model(str(tmp_path / "model"), ".", str(tmp_path / "out"))
    assert _tree(tmp_path / "out") == fastai_model


# --- the uploaded container spec --------------------------------------------------------


def test_a_custom_server_gets_probes_that_wait_for_a_large_model_to_load():
    """Our server opens its port at once and answers 503 while it loads: Vertex must give
    that load time (startup probe, deployment timeout), then check health as usual. The
    spec is what Vertex's API parses: read back through its ModelContainerSpec."""
    from google.cloud.aiplatform_v1.types import ModelContainerSpec

    spec = container_spec("img:1", 0, "/health", "/predict")
    parsed = ModelContainerSpec.from_json(json.dumps(spec))
    startup, health = parsed.startup_probe, parsed.health_probe
    assert (startup.http_get.path, startup.http_get.port) == ("/health", 8080)
    assert startup.period_seconds * startup.failure_threshold == STARTUP_ALLOWANCE_S >= 600
    assert (health.http_get.path, health.failure_threshold) == ("/health", 3)
    for probe in (startup, health):  # Vertex's Probe: the period less than the timeout
        assert probe.period_seconds < probe.timeout_seconds
    assert parsed.deployment_timeout.total_seconds() > STARTUP_ALLOWANCE_S
    assert (parsed.health_route, parsed.predict_route) == ("/health", "/predict")
    assert container_spec("img:1", 9000, "/h")["startupProbe"]["httpGet"]["port"] == 9000


def test_a_prebuilt_serving_image_keeps_vertexs_defaults():
    assert container_spec("us-docker.pkg.dev/vertex-ai/prediction/tf2-cpu.2-15") == {
        "imageUri": "us-docker.pkg.dev/vertex-ai/prediction/tf2-cpu.2-15"}
