"""The manifest: assembled from the shard writers' results, and checked before it is written."""

from __future__ import annotations

from collections import Counter
from typing import Any

from components.shard.contract import (
    IMAGE_KEY,
    KEY_KEY,
    LABEL_KEY,
    MANIFEST_VERSION,
    SPLITS,
    ShardConfig,
    ShardingError,
)
from components.shard.listing import Listing
from components.shard.planning import split_counts


def build_manifest(data_uri: str, listing: Listing, config: ShardConfig, examples_in: int,
                   results: list[dict[str, Any]]) -> dict[str, Any]:
    """Assembles the manifest from the shard writers' results."""
    by_file = {r["file"]: r for r in results}
    splits_out: dict[str, Any] = {}
    skipped = sorted((s for r in results for s in r["skipped"]), key=lambda s: s["path"])
    for split in SPLITS:
        shard_results = [by_file[f] for f in sorted(by_file) if f.startswith(split + "-")]
        counts: Counter[int] = Counter()
        for r in shard_results:
            counts.update({int(k): v for k, v in r["labels"].items()})
        splits_out[split] = {
            "count": sum(counts.values()),
            "class_counts": {name: counts.get(i, 0) for i, name in enumerate(listing.classes)},
            "shards": [
                {k: r[k] for k in ("file", "records", "sha256", "bytes")} for r in shard_results
            ],
        }
    return {
        "format_version": MANIFEST_VERSION,
        "input_uri": data_uri,
        "seed": config.seed,
        "fractions": config.fractions,
        "image": {
            "height": config.image_size,
            "width": config.image_size,
            "channels": 3,
            "format": config.image_format,
            "jpeg_quality": config.jpeg_quality if config.image_format == "jpeg" else None,
            "resize_method": config.resize_method,
        },
        "features": {"image": IMAGE_KEY, "label": LABEL_KEY, "key": KEY_KEY},
        "classes": listing.classes,
        "label_map": {name: i for i, name in enumerate(listing.classes)},
        "examples_in": examples_in,
        "written": sum(s["count"] for s in splits_out.values()),
        "skipped": skipped,
        "ignored": listing.ignored,
        "missing_classes": missing_classes(splits_out, listing.files, config.fractions),
        "duplicate_files": duplicate_files(results),
        "max_skipped_fraction": config.max_skipped_fraction,
        "splits": splits_out,
    }


# Copies listed per kind in the manifest (all are counted).
_LISTED_COPIES = 20


def duplicate_files(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Files written more than once (the same bytes under two paths): how many, and the
    copies that sit in two class folders (one image, two labels) or in two splits (an
    image the model trains on, then is tested on), up to `_LISTED_COPIES` of each listed.

    Args:
        results: The shard writers' results (their `contents`; paths relative to the
            input root, so a path's class is its first folder).
    """
    copies: dict[str, list[tuple[str, str]]] = {}
    for result in results:
        split = result["file"].split("-", 1)[0]
        for path, digest in result.get("contents", {}).items():
            copies.setdefault(digest, []).append((path, split))
    repeated = [sorted(group) for group in copies.values() if len(group) > 1]
    across_classes = sorted([path for path, _ in group] for group in repeated
                            if len({path.split("/", 1)[0] for path, _ in group}) > 1)
    across_splits = sorted([path for path, _ in group] for group in repeated
                           if len({split for _, split in group}) > 1)
    return {"files": sum(len(group) for group in repeated), "images": len(repeated),
            "across_classes": {"count": len(across_classes),
                               "copies": across_classes[:_LISTED_COPIES]},
            "across_splits": {"count": len(across_splits),
                              "copies": across_splits[:_LISTED_COPIES]}}


def missing_classes(splits_out: dict[str, Any], files: dict[str, list[str]],
                    fractions: dict[str, float]) -> list[dict[str, Any]]:
    """Classes with no example in a split that was asked for (fraction > 0).

    A class of a few images rounds to no validation or test example, or loses the one
    it drew to an unreadable file: that split then says nothing about it (and with no
    train example the model never sees it). The splits stay usable for the other
    classes, so this is recorded and warned about, not refused.

    Args:
        splits_out: The manifest's splits, with their per-class counts.
        files: Class name to its listed files, in label order.
        fractions: Split name to share.

    Returns:
        `[{"class", "splits", "reason"}]`, in label order.
    """
    gaps = []
    for name, paths in files.items():
        missing = [s for s in SPLITS
                   if fractions[s] > 0 and splits_out[s]["class_counts"][name] == 0]
        if not missing:
            continue
        drawn = split_counts(len(paths), fractions)
        too_few = [s for s in missing if not drawn[s]]
        lost = [s for s in missing if drawn[s]]
        reasons = []
        if too_few:
            asked = ", ".join(f"{s}_fraction={fractions[s]:g}" for s in too_few)
            reasons.append(f"{len(paths)} file(s) listed: too few for one example in "
                           f"{', '.join(too_few)} at {asked}; add images to this class")
        if lost:
            reasons.append(f"the file(s) drawn for {', '.join(lost)} are unusable (see "
                           "skipped); fix or replace them")
        gaps.append({"class": name, "splits": missing, "reason": "; ".join(reasons)})
    return gaps


def check_manifest(manifest: dict[str, Any]) -> None:
    """Fails when a class has no usable image or too many files were unusable."""
    skipped = manifest["skipped"]
    examples_in = manifest["examples_in"]
    reasons = "; ".join(f"{s['path']}: {s['reason']}" for s in skipped[:5])
    more = f" (and {len(skipped) - 5} more)" if len(skipped) > 5 else ""
    totals = Counter()
    for split in manifest["splits"].values():
        totals.update(split["class_counts"])
    empty = [name for name in manifest["classes"] if totals[name] == 0]
    if empty:
        raise ShardingError(
            f"class(es) {empty} have no usable image after skipping unreadable files "
            f"({reasons}{more}): fix or remove those files"
        )
    share = len(skipped) / examples_in if examples_in else 0.0
    if share > manifest["max_skipped_fraction"]:
        raise ShardingError(
            f"{len(skipped)} of {examples_in} files ({share:.1%}) are unusable, more than "
            f"max_skipped_fraction={manifest['max_skipped_fraction']}: {reasons}{more}. "
            "Fix the files or raise max_skipped_fraction."
        )
