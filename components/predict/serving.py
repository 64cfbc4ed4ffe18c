"""Online prediction with a trained text model: an HTTP server for Vertex AI endpoints.

Vertex's custom-container contract: listen on `AIP_HTTP_PORT` at once; GET
`AIP_HEALTH_ROUTE` answers 200 once the model is loaded (503 before); POST
`AIP_PREDICT_ROUTE` takes `{"instances": [...]}` and answers `{"predictions": [...]}`
(batch prediction's lines without "input"), a bad request a 4xx `{"error": ...}`.
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
from components.predict.prediction import (
    copy_model_locally,
    decision_threshold,
    text_predictions,
)

log = logging.getLogger(__name__)

# Vertex refuses requests over 1.5 MB; 2 MiB passes what it forwards and still bounds memory.
DEFAULT_MAX_REQUEST_BYTES = 2 * 1024 * 1024
# Keeps one request's (serialized) inference short enough not to starve the queue behind it.
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
        model: The model folder asked for; empty or None uses `AIP_STORAGE_URI`.
        port: The port asked for; `AIP_HTTP_PORT` wins.

    Returns:
        The settings; host 0.0.0.0 inside Vertex (AIP_HTTP_PORT set), else 127.0.0.1.

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
    """Raises PredictionError unless `model_dir` (local; given as `name`) is a text model."""
    name = name or model_dir
    if model_family(model_dir, f"model folder {name!r}") != TEXT:
        raise PredictionError(
            f"{name!r} holds an image (Keras) model: this server serves text models only. "
            "Serve image models with Vertex AI's prebuilt TensorFlow serving image (TF Serving), "
            "or label files here with `python -m pipelines.predict`")


def parse_instances(body: bytes, text_keys: Sequence[str], max_instances: int) -> list[str]:
    """The texts of a predict request's body, in order.

    Args:
        body: The raw request body.
        text_keys: Keys an object instance may hold its text under (the first found wins).
        max_instances: The most instances one request may hold.

    Raises:
        RequestError: 400 for a body that is not UTF-8 `{"instances": [...]}` of texts
            (naming the first bad instance), 413 for too many instances.
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
        """Predictions for `texts`, in order, as batch prediction's lines without "input"
        (an empty text's: `{"error": "empty text"}`); blocking: run it off the event loop."""

        def probabilities(usable: list[str]):
            with self._lock:
                return self._model.probabilities(usable, self.batch_size)

        problems = ["" if text.strip() else "empty text" for text in texts]
        return text_predictions(texts, problems, probabilities, self.labels, self.threshold)


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
    """The Starlette app serving a text model (run it with uvicorn). It listens at once and
    loads the model in a thread (Vertex restarts a container that does not answer its first
    probes); until loaded, both routes answer 503 with the reason (or the load error).

    Args:
        model_dir: The training step's model folder (local or gs://).
        health_route: GET path answering 200 once the model is loaded.
        predict_route: POST path taking `{"instances": [...]}`.
        max_request_bytes: Largest body accepted (413 beyond).
        max_instances: Most instances in one request (413 beyond).
        batch_size: Texts per forward pass.
        on_load_error: Called (in the loading thread) with the error when loading fails.
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
        if waiting := not_ready(request):
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
