"""The output folder: claimed before writing, cleared of an earlier run's files on a re-run.

Only files this step can prove its own (named by its manifest, or by the claim an
unfinished run left) are removed; files named like its output but proved by nothing stop
the run, and other files are never touched. An output folder overlapping the input folder
is refused.
"""

from __future__ import annotations

import json
import os
import re

from components.common.storage import TMP_PREFIX, local_path, write_json_atomically
from components.shard.contract import MANIFEST_NAME, MANIFEST_VERSION, SPLITS, ShardingError

# The names this step writes into its output folder. One there that it cannot prove
# its own (`own_files`) stops the run; files with other names are never touched.
_OWN_FILE = re.compile(rf"^({re.escape(TMP_PREFIX)})?"
                       rf"(({'|'.join(SPLITS)})-\d{{5}}-of-\d{{5}}\.tfrecord|{re.escape(MANIFEST_NAME)})$")
# Names the files a run is writing until its manifest does (see `claim_output`).
CLAIM_NAME = ".shard-claim.json"


def own_files(out_dir: str) -> set[str]:
    """Names in `out_dir` this step can prove it wrote: the manifest and the shards it
    names, and what an unfinished run's claim names, each with its temporary name.
    A manifest that is not this step's (not JSON, other keys) proves nothing."""
    names = {CLAIM_NAME}
    try:
        with open(os.path.join(out_dir, MANIFEST_NAME)) as f:
            manifest = json.load(f)
        if manifest["format_version"] == MANIFEST_VERSION:
            names |= {MANIFEST_NAME} | {str(shard["file"]) for split in SPLITS
                                        for shard in manifest["splits"][split]["shards"]}
    except (OSError, ValueError, TypeError, KeyError):
        pass
    try:
        with open(os.path.join(out_dir, CLAIM_NAME)) as f:
            names |= {str(name) for name in json.load(f)["files"]}
    except (OSError, ValueError, TypeError, KeyError):
        pass
    return names | {TMP_PREFIX + name for name in names}


def claim_output(out_dir: str, names: list[str]) -> None:
    """Records the files a run is about to write, before it writes them: a run killed
    mid-way leaves no manifest, and the claim is what proves its leftovers ours."""
    write_json_atomically(os.path.join(out_dir, CLAIM_NAME),
                          {"files": sorted(set(names) | {MANIFEST_NAME})})


def remove_own_files(out_dir: str) -> None:
    """Removes the files `own_files` proves ours: the manifest first, so nothing looks
    whole, and the claim last, so a kill half-way still leaves the rest provably ours."""
    present = set(os.listdir(out_dir)) if os.path.isdir(out_dir) else set()
    claims = [name for name in (CLAIM_NAME, TMP_PREFIX + CLAIM_NAME) if name in present]
    doomed = sorted((present & own_files(out_dir)) - set(claims))
    if doomed:
        claim_output(out_dir, doomed)
        claims = [CLAIM_NAME]
    for name in sorted(doomed, key=lambda n: n != MANIFEST_NAME) + claims:
        os.remove(os.path.join(out_dir, name))


def clear_output(out_dir: str) -> None:
    """Removes what an earlier run of this step wrote; other files are left alone.

    Raises:
        ShardingError: The folder holds files named like this step's output that no
            manifest or claim of this step names (another dataset's shards, another
            tool's manifest): they are kept, and nothing is removed.
    """
    if not os.path.isdir(out_dir):
        return
    foreign = sorted(name for name in set(os.listdir(out_dir)) - own_files(out_dir)
                     if _OWN_FILE.match(name))
    if foreign:
        more = f" and {len(foreign) - 5} more" if len(foreign) > 5 else ""
        raise ShardingError(
            f"output folder {out_dir!r} holds {', '.join(foreign[:5])}{more}, named like this "
            "step's output but named by no manifest of this step, so perhaps another "
            "dataset's; they are left alone: choose an empty output folder, or move or "
            "remove those files")
    remove_own_files(out_dir)


def check_output_folder(data_uri: str, out_dir: str) -> None:
    """Refuses an output folder inside the input folder (or the reverse): its shards
    would be listed as images of a class on the next run, or the input overwritten.

    Raises:
        ShardingError: The two folders overlap.
    """
    if data_uri.startswith("s3://"):
        return  # an S3 bucket is never a local folder
    source = os.path.realpath(local_path(data_uri) if data_uri.startswith("gs://")
                              else data_uri)
    target = os.path.realpath(out_dir)
    if os.path.commonpath([source, target]) in (source, target):
        raise ShardingError(
            f"output folder {out_dir!r} and input folder {data_uri!r} overlap: the shards "
            "would be read as images next time, or the images overwritten; write the "
            "output outside the input folder")
