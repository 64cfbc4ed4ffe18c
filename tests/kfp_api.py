"""A loopback stand-in for the KFP API server that the submit tests talk to through
kfp.Client: it records every request and answers the project's calls as v2beta1 does."""

import http.server
import json
import threading


class KfpApiStub:
    """The stand-in, serving on a free loopback port until `close`.

    Args:
        runs: Run id -> its state, for reading and retrying runs.
    """

    def __init__(self, runs: dict[str, str] | None = None):
        self.requests = []
        stub, runs = self, dict(runs or {})

        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"null")
                stub.requests.append({"method": self.command, "path": self.path,
                                      "auth": self.headers.get("Authorization"),
                                      "body": body})
                path = self.path.split("?")[0]
                run_id = path.removeprefix("/apis/v2beta1/runs/").removesuffix(":retry")
                if path == "/apis/v2beta1/healthz":  # kfp.Client's, in namespace kubeflow
                    answer = {"multi_user": False}
                elif self.command == "GET" and path == "/apis/v2beta1/experiments":
                    answer = {"experiments": []}
                elif self.command == "POST" and path == "/apis/v2beta1/experiments":
                    answer = {**body, "experiment_id": "exp-1"}
                elif self.command == "POST" and path == "/apis/v2beta1/runs":
                    answer = {"run_id": "run-1", "display_name": body["display_name"],
                              "experiment_id": body["experiment_id"], "state": "PENDING"}
                elif path.startswith("/apis/v2beta1/runs/") and run_id in runs:
                    answer = {} if path.endswith(":retry") else {
                        "run_id": run_id, "display_name": "image-classifier",
                        "state": runs[run_id]}
                else:
                    self.send_response(404)
                    self.end_headers()
                    return
                data = json.dumps(answer).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = _answer

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()
