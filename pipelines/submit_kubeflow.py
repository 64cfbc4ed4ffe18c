"""Start a run of a compiled Kubeflow pipeline (`compile.py --target kubeflow`) on a KFP server.

    python -m pipelines.submit --target kubeflow build/kubeflow/image_pipeline.yaml \\
        --host https://KFP_HOST [--namespace NS] [--experiment NAME] \\
        [--service-account KSA] [--token-file PATH] --param data_uri=gs://BUCKET/pets \\
        [--param image_size=160 ...] [--display-name N] [--no-cache] [--dry-run]
    python -m pipelines.submit --target kubeflow --retry RUN_ID --host https://KFP_HOST \\
        [--namespace NS] [--token-file PATH] [--dry-run]

The run, its pipeline spec and Kubernetes settings go through `kfp.Client`, in the experiment
named (created when missing); `--param` values are checked and typed as for Vertex. A
multi-user install needs `--namespace` (the profile's) and a bearer token for the audience
`pipelines.kubeflow.org` (`--token-file`, e.g. the output of `kubectl create token
default-editor -n NS --audience=pipelines.kubeflow.org`). Bad input exits with code 2.

`--retry RUN_ID` continues a failed (or terminated) run as the UI's Retry button does: the
finished steps are kept (their outputs reused), the failed and unrun ones run again under
the same output URIs; a training step compiled with `--checkpoint-root` resumes there.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import sys
import tempfile
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import urlparse

from components.common.commands import reports
from pipelines.compiled import SubmitError, declared_parameters, load_pipeline_spec, parse_params

# Kubernetes names: a namespace is a DNS-1123 label, a service account a DNS-1123 subdomain.
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")


@dataclasses.dataclass(frozen=True)
class KubeflowSubmission:
    """A run to start on a KFP server, checked and typed (the options of the same names;
    `params` typed as the pipeline declares them, `enable_caching` None: as compiled)."""

    template_path: str
    host: str
    namespace: str
    experiment: str
    service_account: str
    token: str
    params: dict[str, Any]
    display_name: str
    enable_caching: bool | None


def plan(args: argparse.Namespace) -> KubeflowSubmission:
    """Checks the command line and the file; nothing is sent.

    Raises:
        SubmitError: Naming the option or the file at fault.
    """
    spec = load_pipeline_spec(args.template)
    text = json.dumps(spec)
    if "pipeline_google_cloud" in text or "worker_pool_specs" in text:
        raise SubmitError(f"{args.template} was compiled for Vertex: compile with `python "
                          "compile.py --target kubeflow` (build/kubeflow/*.yaml)")
    params = parse_params(args.param, declared_parameters(spec))
    check_host(args.host, args.namespace)
    if args.service_account and not _DNS_SUBDOMAIN.match(args.service_account):
        raise SubmitError(f"--service-account {args.service_account!r} is not a Kubernetes "
                          "service account name (not an email: runs use a Kubernetes account)")
    token = read_token(args.token_file)
    return KubeflowSubmission(
        template_path=args.template, host=args.host.rstrip("/"), namespace=args.namespace,
        experiment=args.experiment or spec["pipelineInfo"]["name"],
        service_account=args.service_account, token=token, params=params,
        display_name=args.display_name or spec["pipelineInfo"]["name"],
        enable_caching=False if args.no_cache else None)


def check_host(host: str, namespace: str) -> None:
    """Refuses a malformed KFP endpoint or namespace (SubmitError)."""
    url = urlparse(host)
    if url.scheme not in ("http", "https") or not url.netloc:
        raise SubmitError(f"--host {host!r} must be the KFP endpoint's URL, "
                          "http(s)://HOST[:PORT][/PATH]")
    if not _DNS_LABEL.match(namespace):
        raise SubmitError(f"--namespace {namespace!r} is not a Kubernetes namespace name")


def read_token(path: str) -> str:
    """The bearer token in the file at `path` ("" for no file); SubmitError if unreadable
    or empty."""
    if not path:
        return ""
    try:
        with open(path) as f:
            token = f.read().strip()
    except OSError as err:
        raise SubmitError(f"--token-file {path}: {err.strerror}") from err
    if not token:
        raise SubmitError(f"--token-file {path} is empty")
    return token


def describe(submission: KubeflowSubmission) -> dict[str, Any]:
    """What would be sent, for --dry-run (the token left out)."""
    return {"host": submission.host, "namespace": submission.namespace,
            "experiment": submission.experiment, "run": submission.display_name,
            "service_account": submission.service_account or "(the namespace's default)",
            "authenticated": bool(submission.token), "parameters": submission.params,
            "caching": "off" if submission.enable_caching is False else "as compiled"}


def launch(submission: KubeflowSubmission, client_class: Callable | None = None) -> str:
    """Starts the run; returns its id.

    Args:
        submission: The checked run.
        client_class: `kfp.Client` (tests give the same class; it reaches a loopback server).
    """
    client = _client(client_class, submission.host, submission.namespace, submission.token)
    with tempfile.TemporaryDirectory() as scratch:
        path = submission.template_path
        if submission.enable_caching is False:
            # kfp.Client's own override misses the tasks in loops and conditions
            path = os.path.join(scratch, os.path.basename(path))
            write_without_cache(submission.template_path, path)
        result = client.create_run_from_pipeline_package(
            path, arguments=submission.params, run_name=submission.display_name,
            experiment_name=submission.experiment, namespace=submission.namespace,
            service_account=submission.service_account or None)
    return result.run_id


# The run states KFP's retry takes: its workflow Failed or Errored (a terminated run too).
RETRYABLE_STATES = ("FAILED", "CANCELED")


def _client(client_class: Callable | None, host: str, namespace: str, token: str):
    """A `kfp.Client` (or `client_class`) of the server, with the bearer token if any."""
    if client_class is None:
        from kfp import Client as client_class

    return client_class(host=host, namespace=namespace, existing_token=token or None)


def write_without_cache(source: str, target: str) -> None:
    """Copies the compiled file `source` to `target` with caching off for every task."""
    import yaml

    with open(source) as f:
        documents = list(yaml.safe_load_all(f))
    spec = documents[0]
    dags = [spec["root"]["dag"], *(c["dag"] for c in spec.get("components", {}).values()
                                   if "dag" in c)]
    for dag in dags:
        for task in dag.get("tasks", {}).values():
            task["cachingOptions"] = {"enableCache": False}
    with open(target, "w") as f:
        yaml.safe_dump_all(documents, f, sort_keys=False)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m pipelines.submit --target kubeflow",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("template", nargs="?",
                   help="compiled pipeline, e.g. build/kubeflow/image_pipeline.yaml")
    p.add_argument("--retry", default="", metavar="RUN_ID",
                   help="continue this failed run instead of starting one: its finished "
                        "steps are kept and the others run again; the training step "
                        "resumes from its checkpoints when compiled with --checkpoint-root")
    p.add_argument("--host", required=True, help="KFP endpoint, e.g. https://kfp.example.com")
    p.add_argument("--namespace", default="kubeflow",
                   help="the run's namespace (multi-user: your profile's)")
    p.add_argument("--experiment", default="", help="default: the pipeline's name")
    p.add_argument("--service-account", default="",
                   help="Kubernetes service account of the run's pods; empty: the "
                        "server's default (default-editor in a multi-user profile)")
    p.add_argument("--token-file", default="",
                   help="file holding a bearer token for the server (multi-user installs: "
                        "audience pipelines.kubeflow.org)")
    p.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                   help="pipeline parameter; repeatable")
    p.add_argument("--display-name", default="", help="default: the pipeline's name")
    p.add_argument("--no-cache", action="store_true", help="re-run every step")
    p.add_argument("--dry-run", action="store_true", help="print the request, send nothing")
    return p


@reports(SubmitError)
def main(argv: Sequence[str], client_class: Callable | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    if bool(args.retry) == bool(args.template):
        p.error("give either the compiled pipeline or --retry RUN_ID")
    if args.retry:
        return _retry(args, client_class)
    submission = plan(args)
    if args.dry_run:
        print(json.dumps(describe(submission), indent=2, sort_keys=True))
        return 0
    run_id = launch(submission, client_class)
    print(f"started run {run_id} in experiment {submission.experiment!r} "
          f"({submission.host}/#/runs/details/{run_id})")
    return 0


def _retry(args: argparse.Namespace, client_class: Callable | None) -> int:
    """`--retry RUN_ID`: checks the options, then asks the server to retry the failed run
    (KFP's run retry); SubmitError for a run KFP does not retry (running, or it succeeded)."""
    from kfp_server_api.exceptions import ApiException

    check_host(args.host, args.namespace)
    token = read_token(args.token_file)
    if args.param or args.display_name or args.no_cache or args.service_account or args.experiment:
        raise SubmitError("--retry keeps the run's parameters and settings: give only "
                          "--host, --namespace and --token-file with it")
    host = args.host.rstrip("/")
    if args.dry_run:
        print(json.dumps({"host": host, "namespace": args.namespace, "retry": args.retry,
                          "authenticated": bool(token)}, indent=2))
        return 0
    try:
        client = _client(client_class, host, args.namespace, token)
        run = client.get_run(args.retry)
        if str(run.state) not in RETRYABLE_STATES:
            raise SubmitError(f"run {args.retry} ({run.display_name}) is {run.state}: KFP "
                              "retries a failed or terminated run only")
        # kfp.Client has no method for it: its `runs`, the RunServiceApi the UI calls, does.
        client.runs.run_service_retry_run(run_id=args.retry)
    except ApiException as err:  # the server refused it (no such run, not allowed)
        print(f"error: KFP did not retry run {args.retry}: {err.status} {err.reason} "
              f"{err.body or ''}".rstrip(), file=sys.stderr)
        return 1
    print(f"retrying run {args.retry} ({run.display_name}): finished steps kept, the others "
          f"run again ({host}/#/runs/details/{args.retry})")
    return 0
