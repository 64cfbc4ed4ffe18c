"""Serve a trained text model over HTTP, here or as a Vertex AI endpoint's container.

    python -m pipelines.serve --model <model folder> --port 8080

POST `{"instances": ["a text", {"text": "another"}]}` to /predict; the answer is
`{"predictions": [{"labels": [...], "scores": {...}}, ...]}`, in the same order. GET /health
answers 503 while the model loads, 200 once it is loaded; a model that fails to load stops
the server (exit status 1). As a Vertex model's serving container, AIP_HTTP_PORT,
AIP_HEALTH_ROUTE, AIP_PREDICT_ROUTE and AIP_STORAGE_URI (the model, without --model) take
over, and the server listens on every interface. Image models are served by Vertex's
prebuilt TensorFlow serving image.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from components.common.storage import is_remote
from components.predict.contract import PredictionError

log = logging.getLogger("pipelines.serve")


def main(argv: list[str] | None = None) -> int:
    from components.predict import serving

    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="",
                        help="trained text model folder (local or gs://); default: AIP_STORAGE_URI")
    parser.add_argument("--port", type=int, default=serving.DEFAULT_PORT,
                        help="port to listen on (AIP_HTTP_PORT wins when set)")
    parser.add_argument("--batch-size", type=int, default=serving.DEFAULT_BATCH_SIZE,
                        help="texts per forward pass")
    parser.add_argument("--max-instances", type=int, default=serving.DEFAULT_MAX_INSTANCES,
                        help="most instances in one request (413 beyond)")
    parser.add_argument("--max-request-bytes", type=int,
                        default=serving.DEFAULT_MAX_REQUEST_BYTES,
                        help="largest request body in bytes (413 beyond)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    for name in ("batch_size", "max_instances", "max_request_bytes"):
        if getattr(args, name) < 1:
            print(f"error: --{name.replace('_', '-')} must be >= 1", file=sys.stderr)
            return 2

    try:
        settings = serving.serve_settings(os.environ, args.model, args.port)
        if not is_remote(settings.model):
            serving.check_servable(settings.model)  # a clear exit now, not a failed load
    except (PredictionError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    failed: list[str] = []

    def stop(error: str) -> None:  # the container exits and its log says why
        failed.append(error)
        server.should_exit = True

    # The port opens at once; the model (copied first when on gs://) loads behind it.
    app = serving.build_app(settings.model, settings.health_route, settings.predict_route,
                            max_request_bytes=args.max_request_bytes,
                            max_instances=args.max_instances, batch_size=args.batch_size,
                            on_load_error=stop)
    import uvicorn

    url = f"http://{settings.host}:{settings.port}"
    log.info("serving %s at %s: GET %s, POST %s", settings.model, url,
             settings.health_route, settings.predict_route)
    server = uvicorn.Server(uvicorn.Config(app, host=settings.host, port=settings.port,
                                           lifespan="on", log_level="info"))
    try:
        server.run()
    except KeyboardInterrupt:  # uvicorn shuts down on Ctrl+C, then raises it again
        pass
    if failed:
        print(f"error: the model failed to load: {failed[0]}", file=sys.stderr)
        return 1
    return 0 if server.started else 1  # not started: uvicorn logged why


if __name__ == "__main__":
    sys.exit(main())
