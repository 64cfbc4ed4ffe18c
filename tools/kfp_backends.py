"""Check compiled Kubeflow files against the protos of each KFP backend the docs support.

    python -m tools.kfp_backends build/kubeflow/*.yaml [--backend 2.14 ...]

KFP's API server reads a pipeline with the definitions of its own version and, at Create
run, refuses an executor's Kubernetes field it does not know
(`backend/src/v2/compiler/argocompiler/container.go`). Those definitions ship on PyPI
(`kfp-pipeline-spec==X`, `kfp-kubernetes==X`) as `*_pb2` modules, each version pinning its
own protobuf: each backend gets an environment of its own (`pip install --target` under
`.cache/kfp-backends/<backend>`), where each file is parsed strictly: the first document as
`PipelineSpec`, the second as `PlatformSpec`, each executor as `KubernetesExecutorConfig`.
Prints one line per refusal; exit 1 if any.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence

# The backends the Kubeflow files support (docs/kubeflow.md), oldest first: each one's first
# release (later patches only add fields) and the protobuf that release pins.
BACKENDS: Mapping[str, Mapping[str, str]] = {
    backend: {"kfp-pipeline-spec": f"{backend}.0", "kfp-kubernetes": f"{backend}.0",
              "protobuf": protobuf}
    for backend, protobuf in (("2.14", "6.31.1"), ("2.15", "6.31.1"), ("2.16", "6.31.1"),
                              ("2.17", "6.33.5"))}
# pipeline_spec.proto imports google/rpc/status.proto: a release whose generated code
# runs on every protobuf above (1.73 on needs protobuf >= 6.33.5 at run time).
COMMON_PROTOS = "googleapis-common-protos==1.72.0"
CACHE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".cache",
                     "kfp-backends")

# Runs inside a backend's environment (python -S: no site-packages, only its own folder).
_CHECKER = r"""
import importlib, json, os, sys, types
from google.protobuf import json_format

root = sys.argv[1]
# kfp.kubernetes's __init__ imports kfp.dsl (not installed): its package without it.
package = types.ModuleType("kfp.kubernetes")
package.__path__ = [os.path.join(root, "kfp", "kubernetes")]
sys.modules["kfp.kubernetes"] = package
spec_pb2 = importlib.import_module("kfp.pipeline_spec.pipeline_spec_pb2")
k8s_pb2 = importlib.import_module("kfp.kubernetes.kubernetes_executor_config_pb2")

def strict(message, payload, where):
    try:
        json_format.ParseDict(payload, message, ignore_unknown_fields=False)
    except json_format.ParseError as err:
        return [f"{where}: {' '.join(str(err).split())}"]
    return []

problems = []
for path, documents in json.load(sys.stdin).items():
    problems += strict(spec_pb2.PipelineSpec(), documents[0], f"{path}: pipeline spec")
    platforms = documents[1] if len(documents) > 1 else None
    if platforms:
        problems += strict(spec_pb2.PlatformSpec(), platforms, f"{path}: platform spec")
        executors = (platforms.get("platforms", {}).get("kubernetes", {})
                     .get("deploymentSpec", {}).get("executors", {}))
        for name, config in executors.items():
            problems += strict(k8s_pb2.KubernetesExecutorConfig(), config,
                               f"{path}: executor {name}")
print(json.dumps(problems))
"""


def environment(backend: str, cache: str = CACHE) -> str:
    """The folder (`cache`/`backend`) where `backend`'s pins of BACKENDS are installed, once."""
    pins = [f"{name}=={version}" for name, version in BACKENDS[backend].items()]
    return installed(backend, [*pins, COMMON_PROTOS], cache)


def installed(name: str, pins: Sequence[str], cache: str) -> str:
    """`<cache>/<name>`: a `pip install --no-deps --target` of `pins`, made again only when
    they change (its `.installed` stamp names them)."""
    import fcntl

    folder = os.path.abspath(os.path.join(cache, name))
    stamp = os.path.join(folder, ".installed")
    os.makedirs(cache, exist_ok=True)
    # one install at a time: test workers may ask for the same environment together
    with open(os.path.join(cache, f".{name}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.path.exists(stamp) and open(stamp).read() == " ".join(pins):
            return folder
        partial = folder + ".partial"
        shutil.rmtree(partial, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                        "--no-compile", "--target", partial, *pins], check=True)
        with open(os.path.join(partial, ".installed"), "w") as out:
            out.write(" ".join(pins))
        shutil.rmtree(folder, ignore_errors=True)
        os.replace(partial, folder)
    return folder


def read_documents(paths: Iterable[str]) -> dict[str, list]:
    """Each compiled file's YAML documents (the spec, then the platform settings)."""
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    documents = {}
    for path in paths:
        with open(path) as source:
            documents[path] = [doc for doc in yaml.load_all(source, Loader=loader) if doc]
    return documents


def refusals(documents: Mapping[str, list], backend: str, cache: str = CACHE) -> list[str]:
    """What `backend`'s API server would refuse in `documents` (read_documents), a line each."""
    folder = environment(backend, cache)
    result = subprocess.run([sys.executable, "-S", "-c", _CHECKER, folder],
                            input=json.dumps(documents), capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": folder})
    if result.returncode:
        raise RuntimeError(f"checking against KFP {backend}'s protos failed: "
                           f"{result.stderr.strip()}")
    return json.loads(result.stdout)


def main(argv: Sequence[str] | None = None) -> int:
    """Prints every refusal of every file under every backend asked for."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="+", help="compiled Kubeflow YAML files")
    parser.add_argument("--backend", action="append", choices=list(BACKENDS),
                        help="a backend to check against (repeatable); default: all")
    parser.add_argument("--cache", default=CACHE, help="where the environments are kept")
    args = parser.parse_args(argv)
    documents = read_documents(args.files)
    failed = False
    for backend in args.backend or BACKENDS:
        found = refusals(documents, backend, args.cache)
        failed |= bool(found)
        print(f"KFP {backend}: {len(documents)} files, "
              f"{'refused: ' + str(len(found)) if found else 'all parse'}")
        for line in found:
            print(f"  {line}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
