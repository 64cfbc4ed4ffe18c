"""Check a TrainJob manifest against the API of each Kubeflow Trainer release.

Each Trainer release publishes its API's pydantic models on PyPI (`kubeflow-trainer-api==X`,
the fields its CRD takes). The launcher's check, `components.trainjob.spec.validate_manifest`,
runs here once per release, in a process whose path puts that release's package (installed
under `.cache/trainer-releases/<release>` by `make backends`) before the venv's own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from typing import Any

from tools.kfp_backends import installed

# Each release's models, oldest first.
RELEASES: Mapping[str, str] = {"2.1": "2.1.0", "2.2": "2.2.0", "2.3": "2.3.0"}
# Those the TrainJob runs on (docs/kubeflow.md): 2.1 has `podTemplateOverrides`, no
# `runtimePatches` and no `activeDeadlineSeconds`.
SUPPORTED = ("2.2", "2.3")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CACHE = os.path.join(ROOT, ".cache", "trainer-releases")

_CHECKER = r"""
import json, sys
import kubeflow_trainer_api
from components.trainjob import spec
try:
    spec.validate_manifest(json.load(sys.stdin))
    problem = ""
except Exception as error:  # spec.ManifestError or pydantic's ValidationError
    problem = f"{type(error).__name__}: {error}"
print(json.dumps([kubeflow_trainer_api.__version__, problem]))
"""


def environment(release: str, cache: str = CACHE) -> str:
    """The folder holding `release`'s `kubeflow-trainer-api` (a key of RELEASES), made once."""
    return installed(release, [f"kubeflow-trainer-api=={RELEASES[release]}"], cache)


def refusal(manifest: Mapping[str, Any], release: str, cache: str = CACHE) -> str:
    """What `release`'s API would refuse in `manifest`, naming each field; empty when its
    models read it whole."""
    folder = environment(release, cache)
    result = subprocess.run([sys.executable, "-c", _CHECKER], input=json.dumps(manifest),
                            capture_output=True, text=True, cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join([folder, ROOT])})
    if result.returncode:
        raise RuntimeError(f"checking against Trainer {release} failed: {result.stderr.strip()}")
    version, problem = json.loads(result.stdout)
    if version != RELEASES[release]:  # the venv's own package shadowed the release's
        raise RuntimeError(f"read with kubeflow-trainer-api {version}, not {RELEASES[release]}")
    return problem
