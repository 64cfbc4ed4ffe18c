"""The prediction server: Vertex AI's custom-container contract, over real HTTP.

A tiny AWD-LSTM is trained here in seconds (test_text_train's settings); the server runs
it in uvicorn on a free loopback port, and its answers are compared with batch
prediction's for the same texts. Bad requests get a JSON 4xx and the server serves on.
"""

import contextlib
import http.client
import json
import os
import socket
import threading
import time

import pandas as pd
import pytest

from components.predict.contract import PredictionError, read_predictions
from components.predict.serving import (
    RequestError,
    ServeSettings,
    TextPredictor,
    build_app,
    parse_instances,
    serve_settings,
)
from components.text_common.contract import MAX_TEXT_CHARS, read_labels
from pipelines import serve as serve_cli
from tests.conftest import free_port, http_json, served_as_on_vertex

TEXTS = ["Livraison rapide, prix correct.", "Le service client est nul.",
         "Qualité excellente mais un peu cher", "", "ok"]
LIMIT_BYTES, LIMIT_INSTANCES = 64 * 1024, 8
AIP_VARS = ("AIP_HTTP_PORT", "AIP_HEALTH_ROUTE", "AIP_PREDICT_ROUTE", "AIP_STORAGE_URI")


# ------------------------------------------------------------------ pure logic, no model

def test_settings_inside_vertex_come_from_the_aip_variables():
    environ = {"AIP_HTTP_PORT": "8081", "AIP_HEALTH_ROUTE": "/v1/health",
               "AIP_PREDICT_ROUTE": "/v1/endpoints/1/deployedModels/2:predict",
               "AIP_STORAGE_URI": "gs://bucket/model"}
    assert serve_settings(environ, None, 9000) == ServeSettings(
        "gs://bucket/model", "0.0.0.0", 8081, "/v1/health",
        "/v1/endpoints/1/deployedModels/2:predict")
    # a model named on the command line wins over Vertex's copy
    assert serve_settings(environ, "/models/m", 9000).model == "/models/m"


def test_settings_outside_vertex_are_the_arguments_on_loopback():
    assert serve_settings({}, "/models/m", 9000) == ServeSettings(
        "/models/m", "127.0.0.1", 9000, "/health", "/predict")
    assert serve_settings({"AIP_STORAGE_URI": "gs://b/m"}, "", 8080).model == "gs://b/m"
    with pytest.raises(PredictionError, match="no model to serve: pass --model"):
        serve_settings({}, "", 8080)
    with pytest.raises(PredictionError, match="AIP_HTTP_PORT='http' is not a port number"):
        serve_settings({"AIP_HTTP_PORT": "http"}, "/m", 8080)


def test_instances_are_texts_or_objects_holding_one():
    keys = ("text", "avis")
    body = json.dumps({"instances": ["a", {"text": "b"}, {"avis": "c", "id": 7}],
                       "parameters": {}}).encode()
    assert parse_instances(body, keys, 3) == ["a", "b", "c"]
    assert parse_instances(b'{"instances": []}', keys, 3) == []
    for body, status, message in [
            (b"{bad", 400, "not valid JSON"),
            (b"\xff\xfe", 400, "not UTF-8: byte 0xff at offset 0"),
            (b'{"instances": ["a", "b\\u0000c"]}', 400, "instances[1] is not text: a NUL"),
            (json.dumps({"instances": ["\x1b\x07\x08"]}).encode(), 400,
             "instances[0] is not text: 3 of its 3 characters are control characters"),
            (b"[]", 400, 'must be a JSON object {"instances"'),
            (b'{"inputs": []}', 400, 'must be a JSON object {"instances"'),
            (b'{"instances": "a"}', 400, '"instances" must be a list, got str'),
            (b'{"instances": ["a", {"txt": "b"}]}', 400, "instances[1] must be a string"),
            (b'{"instances": [{"text": 3}]}', 400, "instances[0] must be"),
            (b'{"instances": ["a", "b", "c", "d"]}', 413, "4 instances in one request; at most 3"),
            # json.loads raises RecursionError on deep nesting: a bad request, not a crash
            (b"[" * 100_000 + b"]" * 100_000, 400, "nested too deeply")]:
        with pytest.raises(RequestError) as caught:
            parse_instances(body, keys, 3)
        assert caught.value.status == status and message in str(caught.value), caught.value


@pytest.fixture
def outside_vertex(monkeypatch):
    for name in AIP_VARS:
        monkeypatch.delenv(name, raising=False)


def test_cli_serves_text_models_only(tmp_path, outside_vertex, capsys):
    (tmp_path / "image").mkdir()
    for name in ("model.keras", "labels.json", "preprocessing.json"):  # what model_family reads
        (tmp_path / "image" / name).write_bytes(b"")
    assert serve_cli.main(["--model", str(tmp_path / "image")]) == 2
    err = capsys.readouterr().err
    assert "image (Keras) model" in err and "TF Serving" in err and "pipelines.predict" in err
    (tmp_path / "empty").mkdir()
    assert serve_cli.main(["--model", str(tmp_path / "empty")]) == 2
    assert "is not a trained model folder" in capsys.readouterr().err
    assert serve_cli.main([]) == 2
    assert "no model to serve" in capsys.readouterr().err


@contextlib.contextmanager
def _serving(app):
    """uvicorn serving `app` in a thread on a free loopback port: yields (server, thread,
    address); stops it and closes its socket on the way out."""
    import uvicorn

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))  # the port is ours before the server starts: no race
        server = uvicorn.Server(uvicorn.Config(app, lifespan="on", log_level="warning"))
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
        thread.start()
        try:
            yield server, thread, sock.getsockname()
        finally:
            server.should_exit = True
            thread.join(timeout=10)


def _wait_until(ready, seconds: float = 10) -> None:
    """Polls `ready` until it holds; fails the test after `seconds`."""
    deadline = time.monotonic() + seconds
    while not ready():
        assert time.monotonic() < deadline
        time.sleep(0.01)


def _gated_predictor(monkeypatch, gate: threading.Event, error: Exception | None = None):
    """TextPredictor stand-in whose load waits for `gate` (a large model still copying),
    then fails with `error` or loads a model of one label."""
    from components.predict import serving

    class SlowPredictor:
        labels, text_keys = ["a"], ("text",)

        def __init__(self, model_dir, batch_size, name=""):
            assert gate.wait(timeout=30)
            if error:
                raise error

        def predict(self, texts):
            return [{"labels": ["a"], "scores": {"a": 0.9}} for _ in texts]

    monkeypatch.setattr(serving, "TextPredictor", SlowPredictor)


def test_the_port_answers_at_once_while_the_model_loads(tmp_path, monkeypatch):
    """Vertex probes a container seconds after it starts: the server must answer (503 and
    why) while the model loads, then 200, instead of opening its port only once loaded."""
    import uvicorn  # noqa: F401 - imported before the clock starts

    gate = threading.Event()
    _gated_predictor(monkeypatch, gate)
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        server, _, address = stack.enter_context(_serving(build_app(str(tmp_path))))
        stack.callback(gate.set)  # first on the way out: a load still waiting ends at once
        _wait_until(lambda: server.started)
        health = http_json(address, "GET", "/health")
        assert time.monotonic() - started < 1.0  # the load has not even begun to finish
        assert health == (503, {"error": "the model is loading"})
        assert _predict(address, {"instances": ["x"]}) == (503, {"error": "the model is loading"})
        gate.set()
        _wait_until(lambda: http_json(address, "GET", "/health")[0] == 200)
        assert _predict(address, {"instances": ["x"]})[0] == 200


def test_a_model_that_fails_to_load_answers_why_and_is_reported(tmp_path, monkeypatch):
    gate, reported = threading.Event(), []
    gate.set()
    _gated_predictor(monkeypatch, gate, error=PredictionError("no labels.json in it"))
    with _serving(build_app(str(tmp_path), on_load_error=reported.append)) as (server, _,
                                                                               address):
        # The load (a thread the startup hook begins) may fail before uvicorn listens.
        _wait_until(lambda: reported and server.started)
        assert reported == ["PredictionError: no labels.json in it"]
        status, answer = http_json(address, "GET", "/health")
        assert status == 503 and "failed to load: PredictionError: no labels.json" in \
            answer["error"]
        assert _predict(address, {"instances": ["x"]})[0] == 503


def test_cli_stops_with_the_error_when_a_gcs_model_fails_to_load(gcs, outside_vertex, capsys):
    """A gs:// model is checked as it loads, behind the open port: an image model there
    stops the server (exit 1) naming why, so the container's log says it."""
    bucket = gcs.create_bucket("models-image")
    for name in ("model.keras", "labels.json", "preprocessing.json"):
        bucket.blob(f"image/{name}").upload_from_string(b"")
    assert serve_cli.main(["--model", "gs://models-image/image", "--port",
                           str(free_port())]) == 1
    assert "image (Keras) model" in capsys.readouterr().err


# ------------------------------------------------------------------ a real server

@pytest.fixture(scope="module", params=["fastai", "transformer"])
def text_model(request, tmp_path_factory):
    """A tiny multi-label model of each text trainer whose training text column is "avis"."""
    from components.prepare_text.preparation import PrepareConfig, prepare_text_dataset
    from components.train_text.contract import TrainConfig
    from components.train_text.training import train_text_classifier
    from tests.test_text_train import FAST, TINY
    from tools.datamakers.demo_text import write_reviews_csv

    root = tmp_path_factory.mktemp("serve")
    write_reviews_csv(str(root / "reviews.csv"), rows=60, seed=1)
    frame = pd.read_csv(root / "reviews.csv").rename(columns={"text": "avis"})
    frame.to_csv(root / "reviews.csv", index=False)
    prepare_text_dataset(str(root / "reviews.csv"), str(root / "dataset"),
                         PrepareConfig(text_column="avis"))
    with pytest.MonkeyPatch.context() as patch:  # checkpoints beside the model, not Vertex's
        patch.delenv("AIP_CHECKPOINT_DIR", raising=False)
        if request.param == "transformer":
            from components.train_transformer.contract import TransformerConfig
            from components.train_transformer.tiny import write_tiny_model
            from components.train_transformer.training import train_transformer

            write_tiny_model(frame["avis"], str(root / "tiny"), hidden_size=32)
            train_transformer(str(root / "dataset"), str(root / "model"), TransformerConfig(
                model_name=str(root / "tiny"), epochs=1, batch_size=8, learning_rate=1e-3))
        else:
            config = TrainConfig(pretrained=False, lm_epochs=0, epochs=1, model_config=TINY,
                                 learning_rate=1e-2, **FAST)  # a given rate: no lr_find
            train_text_classifier(str(root / "dataset"), str(root / "model"), config)
    return str(root / "model")


@pytest.fixture(scope="module")
def server(text_model):
    """uvicorn serving the model in a thread on a free port; yields (host, port)."""
    app = build_app(text_model, max_request_bytes=LIMIT_BYTES, max_instances=LIMIT_INSTANCES)
    with _serving(app) as (server, thread, address):
        _wait_until(lambda: server.started or not thread.is_alive(), 60)
        assert thread.is_alive(), "the server did not start"
        _wait_until(lambda: http_json(address, "GET", "/health")[0] == 200, 60)  # the model loads
        yield address


def _predict(address, payload):
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    return http_json(address, "POST", "/predict", body, {"Content-Type": "application/json"})


def _still_serving(address):
    status, answer = _predict(address, {"instances": ["très bon produit"]})
    assert status == 200 and set(answer["predictions"][0]) == {"labels", "scores"}


@pytest.mark.slow
def test_health_and_predictions_equal_batch_prediction(server, text_model, tmp_path):
    assert http_json(server, "GET", "/health") == (200, {"status": "ok"})
    pd.DataFrame({"avis": TEXTS}).to_csv(tmp_path / "new.csv", index=False)
    assert _batch(text_model, tmp_path)["predicted"] == len(TEXTS) - 1
    expected = read_predictions(str(tmp_path / "p.jsonl"))
    # the text bare, under TEXT_FIELD, or under the training column
    instances = [TEXTS[0], {"text": TEXTS[1]}, {"avis": TEXTS[2]}, TEXTS[3], {"text": TEXTS[4]}]
    status, answer = _predict(server, {"instances": instances})
    assert status == 200 and len(answer["predictions"]) == len(TEXTS)
    for got, line in zip(answer["predictions"], expected):
        if "error" in line:  # the empty text: no scores, as in batch prediction
            assert got == {"error": "empty text"}
        else:
            assert got == {"labels": line["labels"], "scores": line["scores"]}
    labels = read_labels(text_model)
    scores = answer["predictions"][0]["scores"]
    assert list(scores) == labels["labels"]
    # multi-label: the labels at or over labels.json's threshold, as batch prediction decides
    assert answer["predictions"][0]["labels"] == [
        k for k, p in scores.items() if p >= labels["threshold"]]
    assert _predict(server, {"instances": []}) == (200, {"predictions": []})


def _batch(model, folder):
    from components.predict.prediction import predict_to_file

    return predict_to_file(model, str(folder / "new.csv"), str(folder / "p.jsonl"))


@pytest.mark.slow
@pytest.mark.parametrize("body, status, message", [
    # the request's own refusals are test_instances_are_texts_or_objects_holding_one's
    (b'{"instances": ["a",', 400, "not valid JSON"),
    (json.dumps({"instances": ["a", {"title": "b"}]}).encode(), 400, "instances[1] must be"),
    (json.dumps({"instances": ["a"] * (LIMIT_INSTANCES + 1)}).encode(), 413,
     f"at most {LIMIT_INSTANCES}"),
    (json.dumps({"instances": ["a" * LIMIT_BYTES]}).encode(), 413, f"at most {LIMIT_BYTES}"),
    (b"[" * 10_000 + b"]" * 10_000, 400, "nested too deeply"),
])
def test_bad_requests_get_a_json_error_and_the_server_serves_on(server, body, status, message):
    got, answer = _predict(server, body)
    assert got == status and message in answer["error"], answer
    _still_serving(server)


@pytest.mark.slow
def test_body_limit_holds_whatever_the_headers_say(server):
    # A declared length over the limit is refused before any of the body is sent. With no
    # length at all (chunked) the bytes are counted as they come; the client stops sending
    # once over the limit, and gets its answer without finishing the body.
    chunk = b'{"instances": ["' + b"a" * 8000
    for header, value, chunks, words in [
            ("Content-Length", str(10**9), 0, "at most"),
            ("Transfer-Encoding", "chunked", LIMIT_BYTES // len(chunk) + 1, "over")]:
        conn = http.client.HTTPConnection(*server, timeout=60)
        conn.putrequest("POST", "/predict")
        conn.putheader(header, value)
        conn.endheaders()
        for _ in range(chunks):
            conn.send(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        response = conn.getresponse()
        assert response.status == 413 and words in json.loads(response.read())["error"]
        conn.close()
    _still_serving(server)


@pytest.mark.slow
def test_other_paths_and_methods_answer_json(server):
    assert http_json(server, "GET", "/predict") == (405, {"error": "Method Not Allowed"})
    assert http_json(server, "GET", "/nowhere") == (404, {"error": "Not Found"})


@pytest.mark.slow
def test_cli_as_vertex_runs_it_with_the_model_on_gcs(text_model, gcs, tmp_path):
    """`python -m pipelines.serve` with only Vertex's variables: port, routes, gs:// model."""
    bucket = gcs.create_bucket(f"models-{os.path.basename(os.path.dirname(text_model))}")
    for name in os.listdir(text_model):
        bucket.blob(f"text/{name}").upload_from_filename(os.path.join(text_model, name))
    port = free_port()
    route = "/v1/endpoints/1/deployedModels/2:predict"
    aip = {"AIP_HTTP_PORT": str(port), "AIP_HEALTH_ROUTE": "/v1/health",
           "AIP_PREDICT_ROUTE": route, "AIP_STORAGE_URI": f"gs://{bucket.name}/text"}
    log = str(tmp_path / "serve.log")
    with served_as_on_vertex(aip, log) as address:
        status, answer = http_json(address, "POST", route,
                                   json.dumps({"instances": [{"avis": TEXTS[0]}]}).encode())
        assert status == 200 and list(answer["predictions"][0]) == ["labels", "scores"]
    text = open(log).read()
    assert f"GET /v1/health, POST {route}" in text and f"0.0.0.0:{port}" in text


@pytest.mark.slow
def test_concurrent_requests_each_get_their_own_answers(server):
    """Requests in flight together share one learner: each still gets its own texts' answers."""
    from concurrent.futures import ThreadPoolExecutor

    batches = [[TEXTS[i % 3]] * (i + 1) for i in range(6)]
    alone = [_predict(server, {"instances": b})[1] for b in batches]
    with ThreadPoolExecutor(len(batches)) as pool:
        together = list(pool.map(lambda b: _predict(server, {"instances": b})[1], batches))
    assert together == alone
    assert [len(a["predictions"]) for a in together] == [1, 2, 3, 4, 5, 6]


# ------------------------------------------------------------------ texts over the limit

def _long_text(chars: int) -> str:
    words = "Livraison rapide prix correct service client nul qualité excellente".split()
    text = " ".join(words[i % len(words)] for i in range(chars // 5))
    return (text + " " + text)[:chars]


@pytest.mark.slow
def test_a_text_over_spacys_limit_is_read_up_to_the_limit_in_batch_and_online(
        text_model, server, tmp_path):
    """A 1.4-million-character text (spaCy refuses over 1,000,000) is read up to
    MAX_TEXT_CHARS: its row is predicted and flagged, every other row predicted as usual."""
    long = _long_text(1_400_000)
    pd.DataFrame({"avis": [TEXTS[0], long, TEXTS[1]]}).to_csv(tmp_path / "new.csv",
                                                                index=False)
    counts = _batch(text_model, tmp_path)
    assert (counts["predicted"], counts["errors"], counts["truncated"]) == (3, 0, 1)
    assert counts["max_text_chars"] == MAX_TEXT_CHARS
    lines = read_predictions(str(tmp_path / "p.jsonl"))
    assert [line.get("truncated") for line in lines] == [None, True, None]
    # what was read is the text's start: the same scores as for that start alone
    pd.DataFrame({"avis": [long[:MAX_TEXT_CHARS]]}).to_csv(tmp_path / "new.csv", index=False)
    assert _batch(text_model, tmp_path)["truncated"] == 0
    start = read_predictions(str(tmp_path / "p.jsonl"))[0]
    assert start["scores"] == lines[1]["scores"] and "truncated" not in start
    # the server's predictor: the same answer, not an error
    online = TextPredictor(text_model).predict([TEXTS[0], long])
    assert online[1] == {"labels": start["labels"], "scores": start["scores"],
                         "truncated": True}
    assert "truncated" not in online[0]
    # and over HTTP, a text under the test server's body limit
    status, answer = _predict(server, {"instances": [_long_text(MAX_TEXT_CHARS + 5000), "ok"]})
    assert status == 200, answer
    assert answer["predictions"][0]["truncated"] is True
    assert "truncated" not in answer["predictions"][1]
