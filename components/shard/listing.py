"""The labelled files under an input folder: `<data_uri>/<class name>/**/<image file>`.

Stray and hidden files are ignored and recorded with a reason; symbolic links to folders
are followed, except into loops and folders listed already.
"""

from __future__ import annotations

import dataclasses
import os

from components.common.storage import filesystem
from components.shard.contract import ShardingError


@dataclasses.dataclass
class Listing:
    """The labelled files found under an input folder."""

    classes: list[str]
    files: dict[str, list[str]]  # class -> sorted paths relative to the input root
    ignored: list[dict[str, str]]  # {"path", "reason"} for files that are not examples


def list_labelled_files(data_uri: str) -> Listing:
    """Lists `<data_uri>/<class>/**/<file>`; stray and hidden files are ignored and listed.

    Args:
        data_uri: Local folder or `gs://bucket/prefix` with one sub-folder per class.

    Returns:
        The classes (sorted), their files and the ignored files with reasons.

    Raises:
        ShardingError: The folder does not exist, or has fewer than two classes.
    """
    fs, root = filesystem(data_uri)
    root = root.rstrip("/")
    if not fs.isdir(root):
        if fs.isfile(root):
            raise ShardingError(f"data_uri {data_uri!r} is a file, not a folder of class "
                                "folders: give the folder whose sub-folders (one per class) "
                                "hold the images (a CSV of texts is the text pipeline's input)")
        raise ShardingError(f"input folder {data_uri!r} does not exist or is not a folder")
    files: dict[str, list[str]] = {}
    ignored: list[dict[str, str]] = []
    folders = []
    for entry in fs.ls(root, detail=True):
        name = entry["name"].rstrip("/").rsplit("/", 1)[-1]
        # A symbolic link to a folder is a class folder too (listings call it "other").
        if entry["type"] == "directory" or (entry.get("islink") and fs.isdir(entry["name"])):
            folders.append(name)
            if not name.startswith("."):
                files[name] = []
        elif entry.get("islink") and not fs.exists(entry["name"]):
            ignored.append({"path": name, "reason": "symbolic link to nothing"})
        else:
            ignored.append({"path": name, "reason": "outside class folders"})
    # Listed folder by folder: `find` on the root does not enter linked folders.
    listed = {os.path.realpath(f"{root}/{folder}") for folder in files}
    for folder in sorted(folders):
        for path in _find_following_links(fs, f"{root}/{folder}", listed, ignored, root):
            relative = path[len(root):].lstrip("/")
            parts = relative.split("/")
            if folder not in files:  # a hidden top-level folder such as .git/
                ignored.append({"path": relative, "reason": "hidden folder"})
            elif any(part.startswith(".") for part in parts):
                ignored.append({"path": relative, "reason": "hidden file"})
            else:
                files[folder].append(relative)
    empty = sorted(c for c, paths in files.items() if not paths)
    if empty:
        raise ShardingError(
            f"class folder(s) {empty} under {data_uri!r} hold no files: add images or remove them"
        )
    if len(files) < 2:
        raise ShardingError(
            f"found {len(files)} class folder(s) under {data_uri!r}; a classifier needs at least "
            "two: put each class's images in its own sub-folder"
        )
    classes = sorted(files)
    return Listing(classes=classes, files={c: files[c] for c in classes}, ignored=ignored)


def _find_following_links(fs, top: str, listed: set[str], ignored: list[dict[str, str]],
                          root: str) -> list[str]:
    """Files under `top` (sorted), entering symbolic links to folders as `find` does not.

    A linked folder that holds the link (a loop) or overlaps a folder listed already
    (another class, another link) is not entered but recorded in `ignored`: entering it
    would never end, or read the same images twice, perhaps under two labels.
    `listed` holds the real paths of the class folders and grows with each linked
    folder entered (links exist on local disks only: gs:// listings have none).
    """
    found, pending = [], [top]
    while pending:
        for path, info in sorted(fs.find(pending.pop(), detail=True).items()):
            hidden = any(p.startswith(".") for p in path[len(root):].split("/"))
            if not (info.get("islink") and fs.isdir(path)) or hidden:
                found.append(path)
                continue
            target = os.path.realpath(path)
            relative = path[len(root):].lstrip("/")
            holder = os.path.realpath(os.path.dirname(path))
            if os.path.commonpath([target, holder]) == target:
                ignored.append({"path": relative, "reason": f"symbolic link loop: {target} "
                                "holds the link; not entered"})
            elif any(os.path.commonpath([target, seen]) in (target, seen) for seen in listed):
                ignored.append({"path": relative, "reason": "symbolic link to a folder listed "
                                f"already ({target}); not entered, so no image is read twice"})
            else:
                listed.add(target)
                pending.append(path)
    return sorted(found)
