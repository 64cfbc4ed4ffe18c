"""Online prediction with a trained text model: an HTTP server for Vertex AI endpoints.

Follows Vertex AI's custom-container contract: the server listens on `AIP_HTTP_PORT` as
soon as it starts, answers GET on `AIP_HEALTH_ROUTE` with 200 once the model is loaded (503
while it loads), and POST on `AIP_PREDICT_ROUTE` with `{"instances": [...]}`, answering
`{"predictions": [...]}` in the same order. An instance is a text, or an object holding it
under "text" (or under the model's training text column); a prediction is batch
prediction's line without "input": `{"labels": [...], "scores": {<label>: <probability>}}`
(plus `"truncated": true` for a text read only up to `MAX_TEXT_CHARS` characters), or
`{"error": ...}` for an empty text, as batch prediction writes it. A request that cannot be
answered gets a 4xx `{"error": <what to change>}` and the server carries on.

Only text (fastai) models are served here: image models are Keras models, served by
Vertex's prebuilt TensorFlow serving image.
"""

from __future__ import annotations

import contextlib
import json
import logging
import tempfile
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from components.common.input_kinds import text_problem
from components.predict.contract import TEXT, PredictionError, model_family
from components.predict.prediction import copy_model_locally, decision_threshold, prediction_line
from components.text_common.contract import MAX_TEXT_CHARS

log = logging.getLogger(__name__)

# Vertex AI refuses online prediction requests over 1.5 MB before they reach the container;
# 2 MiB lets through whatever Vertex forwards (MB or MiB, with headroom) and still bounds
# what a caller outside Vertex can make the server hold in memory.
DEFAULT_MAX_REQUEST_BYTES = 2 * 1024 * 1024
# 1.5 MB holds hundreds of thousands of short texts; the cap keeps one request's inference
# (serialized: one at a time) short enough not to starve the requests queued behind it.
DEFAULT_MAX_INSTANCES = 1000
DEFAULT_BATCH_SIZE = 64
DEFAULT_PORT = 8080  # Vertex's default AIP_HTTP_PORT


class RequestError(Exception):
    """A request the server refuses; `status` is its HTTP status (4xx)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class ServeSettings:
    """Where and what to serve, resolved from the command line and Vertex's variables."""

    model: str
    host: str
    port: int
    health_route: str
    predict_route: str


def serve_settings(environ: Mapping[str, str], model: str | None,
                   port: int = DEFAULT_PORT) -> ServeSettings:
    """The server's settings: Vertex's AIP_* variables where set, else the arguments.

    Args:
        environ: The environment (`os.environ`).
        model: The model folder asked for on the command line; empty or None uses
            `AIP_STORAGE_URI` (where Vertex copied the model artifact).
        port: The port asked for; `AIP_HTTP_PORT` wins (Vertex sends traffic there).

    Returns:
        The settings. The host is 0.0.0.0 inside Vertex (AIP_HTTP_PORT set: traffic comes
        from outside the container), else 127.0.0.1 (a local server is not exposed).

    Raises:
        PredictionError: No model folder anywhere, or AIP_HTTP_PORT is not a port number.
    """
    model = model or environ.get("AIP_STORAGE_URI", "")
    if not model:
        raise PredictionError("no model to serve: pass --model <model folder> (local or gs://),"
                              " or set AIP_STORAGE_URI as Vertex AI does")
    vertex_port = environ.get("AIP_HTTP_PORT", "")
    if vertex_port:
        try:
            port = int(vertex_port)
        except ValueError:
            raise PredictionError(f"AIP_HTTP_PORT={vertex_port!r} is not a port number") from None
    if not 0 < port < 65536:
        raise PredictionError(f"port must be in 1..65535, got {port}")
    return ServeSettings(model=model, host="0.0.0.0" if vertex_port else "127.0.0.1", port=port,
                         health_route=environ.get("AIP_HEALTH_ROUTE") or "/health",
                         predict_route=environ.get("AIP_PREDICT_ROUTE") or "/predict")


def check_servable(model_dir: str, name: str = "") -> None:
    """Raises PredictionError unless `model_dir` (local) is a text model folder.

    Args:
        model_dir: The local folder.
        name: The folder as the user gave it (a gs:// URI copied to `model_dir`), for
            the message.
    """
    name = name or model_dir
    if model_family(model_dir, f"model folder {name!r}") != TEXT:
        raise PredictionError(
            f"{name!r} holds an image (Keras) model: this server serves text models only. "
            "Serve image models with Vertex AI's prebuilt TensorFlow serving image (TF Serving), "
            "or label files here with `python -m pipelines.predict`")


# ------------------------------------------------------------------------- requests


def parse_instances(body: bytes, text_keys: Sequence[str], max_instances: int) -> list[str]:
    """The texts of a predict request's body, in order.

    Args:
        body: The raw request body.
        text_keys: Keys an object instance may hold its text under (the first found wins).
        max_instances: The most instances one request may hold.

    Raises:
        RequestError: 400 for a body that is not UTF-8 `{"instances": [...]}` of texts
            (naming the first bad instance's index; a text is what
            `input_kinds.text_problem` accepts) or is nested too deeply to parse, 413 for
            too many instances.
    """
    try:
        # UTF-8 declared: json.loads would take UTF-16 and UTF-32 bytes as well.
        payload = json.loads(body.decode("utf-8"))
    except UnicodeDecodeError as err:
        raise RequestError(400, f"the body is not UTF-8: byte {body[err.start]:#04x} at offset "
                                f"{err.start} does not decode; send JSON encoded as UTF-8"
                           ) from None
    except ValueError as err:  # JSONDecodeError
        raise RequestError(400, f"the body is not valid JSON: {err}") from None
    except RecursionError:  # arrays/objects nested deeper than Python's recursion limit
        raise RequestError(400, "the body's JSON is nested too deeply; send "
                                '{"instances": [...]} of texts') from None
    if not isinstance(payload, dict) or "instances" not in payload:
        raise RequestError(400, 'the body must be a JSON object {"instances": [...]}')
    instances = payload["instances"]
    if not isinstance(instances, list):
        raise RequestError(400, f'"instances" must be a list, got {type(instances).__name__}')
    if len(instances) > max_instances:
        raise RequestError(413, f"{len(instances)} instances in one request; at most "
                                f"{max_instances}: split the request")
    texts = []
    shape = " or ".join(f'{{"{key}": "..."}}' for key in text_keys)
    for i, instance in enumerate(instances):
        if isinstance(instance, dict):
            key = next((k for k in text_keys if k in instance), None)
            instance = instance[key] if key is not None else None
        if not isinstance(instance, str):
            raise RequestError(400, f"instances[{i}] must be a string or an object {shape} "
                                    "whose value is a string")
        problem = text_problem(instance)
        if problem:
            raise RequestError(400, f"instances[{i}] is {problem}; send UTF-8 text")
        texts.append(instance)
    return texts


def prediction_objects(texts: Sequence[str], probabilities_of, labels: Sequence[str],
                       threshold: float | None) -> list[dict[str, Any]]:
    """One prediction per text, as batch prediction's lines without their "input".

    A text over `MAX_TEXT_CHARS` characters is read up to it (`clip_text`), and
    its prediction adds `"truncated": true`.

    Args:
        texts: The texts.
        probabilities_of: texts -> array (len(texts), len(labels)) of probabilities; called
            once, with the non-empty texts only.
        labels: Label names in column order.
        threshold: Multi-label threshold; None for single-label (see `decide`).
    """
    usable = [i for i, t in enumerate(texts) if t.strip()]
    scored = dict(zip(usable, probabilities_of([texts[i] for i in usable]) if usable else []))
    out = []
    for i in range(len(texts)):
        if i in scored:
            line = prediction_line(None, scored[i], labels, threshold)
            del line["input"]
            if len(texts[i]) > MAX_TEXT_CHARS:  # as batch prediction: read up to the limit
                line["truncated"] = True
        else:  # as batch prediction: an empty text has nothing to score
            line = {"error": "empty text"}
        out.append(line)
    return out


# ------------------------------------------------------------------------------ model


class TextPredictor:
    """A loaded text model: labels, decision rule and learner, safe to call from threads."""

    def __init__(self, model_dir: str, batch_size: int = DEFAULT_BATCH_SIZE,
                 name: str = "") -> None:
        from components.text_common.contract import TEXT_FIELD
        from components.text_common.models import load_text_model

        check_servable(model_dir, name)
        self._model = load_text_model(model_dir)
        info = self._model.info
        self.labels: list[str] = list(info["labels"])
        self.threshold = decision_threshold(info)  # batch prediction's decision rule
        self.text_keys = tuple(dict.fromkeys([TEXT_FIELD, info.get("text_column") or TEXT_FIELD]))
        self.batch_size = batch_size
        # fastai's learner keeps per-call state (dls, callbacks): one prediction at a time
        self._lock = threading.Lock()

    def predict(self, texts: Sequence[str]) -> list[dict[str, Any]]:
        """Predictions for `texts`, in order (blocking: run it off the event loop)."""

        def probabilities(usable: list[str]):
            with self._lock:
                return self._model.probabilities(usable, self.batch_size)

        return prediction_objects(texts, probabilities, self.labels, self.threshold)


# -------------------------------------------------------------------------------- app


async def _read_body(request, limit: int) -> bytes:
    """The request body, refused with 413 as soon as it is known to exceed `limit`."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise RequestError(413, f"the body is {int(declared)} bytes; at most {limit}")
    # counted as it arrives too: a chunked body has no Content-Length to trust
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise RequestError(413, f"the body is over {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def build_app(model_dir: str, health_route: str = "/health", predict_route: str = "/predict",
              max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
              max_instances: int = DEFAULT_MAX_INSTANCES,
              batch_size: int = DEFAULT_BATCH_SIZE,
              on_load_error: Callable[[str], None] | None = None):
    """The Starlette app serving a text model (run it with uvicorn).

    The server listens at once and loads the model in a worker thread (a gs:// folder is
    copied to a temporary folder first, removed at shutdown): Vertex probes a container a
    few seconds after it starts and restarts one that does not answer, and copying a
    base-size encoder (~1 GB) and importing torch can take longer than that. Until the
    model is loaded both routes answer 503 with the reason; a model that fails to load
    keeps answering 503 with the error, and `on_load_error` is called with it.

    Args:
        model_dir: The training step's model folder (local or gs://).
        health_route: GET path answering 200 once the model is loaded, 503 before.
        predict_route: POST path taking `{"instances": [...]}`.
        max_request_bytes: Largest body accepted (413 beyond).
        max_instances: Most instances in one request (413 beyond).
        batch_size: Texts per forward pass.
        on_load_error: Called (in the loading thread) with the error when loading fails,
            e.g. to stop the server so the container exits and says why.
    """
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.exceptions import HTTPException
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    def load(app, workdir: str) -> None:
        try:
            local = copy_model_locally(model_dir, workdir)
            app.state.predictor = TextPredictor(local, batch_size, name=model_dir)
        except Exception as err:  # noqa: BLE001 - any failure is the answer to every request
            app.state.load_error = f"{type(err).__name__}: {err}"
            log.error("model %s failed to load: %s", model_dir, app.state.load_error)
            if on_load_error:
                on_load_error(app.state.load_error)
            return
        log.info("model %s loaded: %d labels", model_dir, len(app.state.predictor.labels))

    @contextlib.asynccontextmanager
    async def lifespan(app):
        app.state.predictor, app.state.load_error = None, None
        with tempfile.TemporaryDirectory(prefix="serve-") as workdir:
            loader = threading.Thread(target=load, args=(app, workdir), daemon=True,
                                      name="load-model")
            loader.start()
            yield
            # a copy under way must not write into the removed folder
            await run_in_threadpool(loader.join)

    def not_ready(request: Request) -> JSONResponse | None:
        """The 503 answer while the model is not loaded, else None."""
        if request.app.state.predictor is not None:
            return None
        error = request.app.state.load_error
        return JSONResponse({"error": f"the model failed to load: {error}" if error
                             else "the model is loading"}, status_code=503)

    async def health(request: Request) -> JSONResponse:
        return not_ready(request) or JSONResponse({"status": "ok"})

    async def predict(request: Request) -> JSONResponse:
        waiting = not_ready(request)
        if waiting is not None:
            return waiting
        predictor: TextPredictor = request.app.state.predictor
        try:
            body = await _read_body(request, max_request_bytes)
            texts = parse_instances(body, predictor.text_keys, max_instances)
        except RequestError as err:
            log.info("refused a request (%d): %s", err.status, err)
            return JSONResponse({"error": str(err)}, status_code=err.status)
        # inference blocks for its whole length: in a worker thread, the loop keeps serving
        predictions = await run_in_threadpool(predictor.predict, texts) if texts else []
        return JSONResponse({"predictions": predictions})

    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        # Starlette's own 404/405 as JSON too, like every other answer of this server
        return JSONResponse({"error": exc.detail}, status_code=exc.status_code,
                            headers=exc.headers)

    async def server_error(request: Request, exc: Exception) -> JSONResponse:
        # Starlette re-raises it after this answer: uvicorn logs the traceback, serves on
        return JSONResponse({"error": f"prediction failed: {type(exc).__name__}: {exc}"},
                            status_code=500)

    return Starlette(
        routes=[Route(health_route, health, methods=["GET"]),
                Route(predict_route, predict, methods=["POST"])],
        exception_handlers={HTTPException: http_error, Exception: server_error},
        lifespan=lifespan)
