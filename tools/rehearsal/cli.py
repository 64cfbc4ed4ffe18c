"""Rehearse a compiled Vertex pipeline (the JSON users upload) on this machine.

    python -m tools.rehearsal build/image_pipeline.json --output DIR [--param NAME=VALUE ...]
        [--pipeline-root gs://BUCKET/root] [--cache-index FILE] [--preempt TASK=GLOB ...]
        [--runtime local|image]

The file runs as Vertex Pipelines would run it, not as the Python pipeline function: the
DAG, `dsl.If` conditions, defaults and each task's inputs are read from the JSON and
placeholders resolved as the Vertex backend resolves them. A GCPC CustomJob payload is
parsed into Vertex's `CustomJob` message (what Vertex would reject fails here) and every
replica of every worker pool runs as a process with the variables Vertex sets
(`CLUSTER_SPEC`, `TF_CONFIG`, `AIP_*`); a tuning job runs its trials one by one (seeded).
`gs://BUCKET/...` is the folder `DIR/gcs/BUCKET/...`, Vertex's `/gcs/` mount; `--runtime
image` runs steps inside the images the JSON names (`make images-local`), as their user.

Vertex API requests (built with GCPC's code, checked against Vertex's messages) are
written to `DIR/vertex-requests/`, not sent. `--preempt TASK=GLOB` preempts TASK's first
replica once GLOB matches under `DIR/gcs/` and restarts it as Vertex does. Writes
`DIR/summary.json` in the shape of `pipelines.run_local`, with a `rehearsal` section.
"""
# The docstring above is the command's --help.

from __future__ import annotations

import argparse
import os
import sys

from pipelines.compiled import SubmitError
from tools.rehearsal.driver import rehearse
from tools.rehearsal.jobs import Preemption
from tools.rehearsal.records import RehearsalError
from tools.rehearsal.runtimes import RUNTIMES


def parser() -> argparse.ArgumentParser:
    """The command line of `python -m tools.rehearsal` (its help is this module's doc)."""
    p = argparse.ArgumentParser(prog="python -m tools.rehearsal", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("pipeline", help="compiled pipeline JSON")
    p.add_argument("--output", required=True, help="local folder of the rehearsal")
    p.add_argument("--param", action="append", default=[], metavar="NAME=VALUE")
    p.add_argument("--pipeline-root", default="gs://rehearsal-bucket/pipeline-root")
    p.add_argument("--cache-index", help="JSON file of cache entries kept across rehearsals")
    p.add_argument("--preempt", action="append", default=[], metavar="TASK=GLOB",
                   help="preempt TASK's first replica (SIGTERM, the kill 30 s later) once GLOB "
                        "matches under OUTPUT/gcs/")
    p.add_argument("--runtime", choices=RUNTIMES, default="local",
                   help="local: steps run in this venv; image: each step runs in the image "
                        "the JSON names, built here by `make images-local` (data must be "
                        "under OUTPUT/gcs/ and passed as gs:// URIs)")
    p.add_argument("--registered-model", action="append", default=[],
                   metavar="DISPLAY_NAME=RESOURCE_NAME",
                   help="a model the stand-in Model Registry holds (the upload then adds a "
                        "version to it); none by default")
    return p


def pairs(p: argparse.ArgumentParser, args: argparse.Namespace, flag: str,
          parts: int = 2) -> list[list[str]]:
    """The values of the repeatable `flag`, each split at its first `parts - 1` "=" as its
    metavar shows (`NAME=VALUE`); exits 2 (`p.error`) on a value that has fewer."""
    action = p._option_string_actions[flag]
    for item in getattr(args, action.dest):
        if len(item.split("=", parts - 1)) != parts:
            p.error(f"{flag} takes {action.metavar}, got {item!r}")
    return [item.split("=", parts - 1) for item in getattr(args, action.dest)]


def main(argv: list[str] | None = None) -> int:
    """Runs `python -m tools.rehearsal` on `argv`; the exit status (1: the rehearsal failed)."""
    p = parser()
    args = p.parse_args(argv)
    params = dict(pairs(p, args, "--param"))
    preempt = [Preemption(task, pattern) for task, pattern in pairs(p, args, "--preempt")]
    registry = dict(pairs(p, args, "--registered-model"))
    try:
        summary = rehearse(args.pipeline, args.output, params, pipeline_root=args.pipeline_root,
                           cache_index=args.cache_index, preempt=preempt,
                           runtime=args.runtime, registry=registry)
    except (RehearsalError, SubmitError) as err:  # SubmitError: no compiled pipeline there
        print(f"rehearsal failed: {err}", file=sys.stderr)
        return 1
    for task in summary["rehearsal"]["tasks"]:
        print(f"  {task['display_name']:<28} {task['state']:<13} cache {task['cache']:<8} "
              f"replicas {task['replicas']} attempts {task['attempts']} "
              f"{task['seconds']:.1f}s {task['note']}")
    print(f"summary: {os.path.join(os.path.abspath(args.output), 'summary.json')}")
    return 0
