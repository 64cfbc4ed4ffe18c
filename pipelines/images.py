"""The images a compiled pipeline runs: their URIs, and the rule every build tags them by."""

from __future__ import annotations

import argparse
import os
import subprocess
from importlib.metadata import version

PLACEHOLDER_REGISTRY = "us-central1-docker.pkg.dev/your-project/vertex-gpu-pipelines"
RUNTIMES = ("tensorflow", "fastai")


def is_pinned(uri: str) -> bool:
    """True for an image URI with a digest, or a tag other than `latest`."""
    if "@sha256:" in uri:
        return True
    name, colon, tag = uri.rsplit("/", 1)[-1].rpartition(":")
    return bool(name and colon) and tag not in ("", "latest")


# One tag rule for every image build: the commit's first 7 hex digits, Cloud Build's
# SHORT_SHA and the Makefile's TAG (`git rev-parse --short` may give more digits).
TAG_DIGITS = 7


def checkout_commit() -> str | None:
    """This checkout's commit as images built from it are tagged; None outside git."""
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], check=True, capture_output=True,
                             text=True, cwd=os.path.dirname(os.path.abspath(__file__))).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    return sha.strip()[:TAG_DIGITS]


def image_uris(args: argparse.Namespace) -> dict[str, str]:
    """Image URI per runtime from --registry/--tag, overridden by --image."""
    if args.tag is None:
        # Local images (the placeholder registry's) keep the package version.
        local = args.registry == PLACEHOLDER_REGISTRY
        args.tag = (None if local else checkout_commit()) or version("vertex-gpu-pipelines")
    if args.tag in ("latest", ""):
        raise SystemExit("error: --tag must name a build (e.g. the git sha), not 'latest'")
    uris = {r: f"{args.registry.rstrip('/')}/{r}:{args.tag}" for r in RUNTIMES}
    for item in args.image:
        runtime, sep, uri = item.partition("=")
        if not sep or runtime not in RUNTIMES:
            raise SystemExit(f"error: --image takes RUNTIME=URI with RUNTIME in {RUNTIMES}")
        if not is_pinned(uri):
            raise SystemExit(f"error: --image {uri!r} must carry a tag or digest other than latest")
        uris[runtime] = uri
    return uris
