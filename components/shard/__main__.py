"""Run the sharding step by hand.

    python -m components.shard DATA_URI OUT_DIR [--image-size 224 ...]
"""

import argparse
import dataclasses
import json
import sys

from components.common.commands import reports
from components.shard.contract import ShardingError
from components.shard.sharding import ShardConfig, shard_dataset


@reports(ShardingError)
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m components.shard", description=__doc__)
    parser.add_argument("data_uri", help="folder (local or gs://) with one sub-folder per class")
    parser.add_argument("out_dir", help="local output folder for shards and manifest.json")
    for field in dataclasses.fields(ShardConfig):
        parser.add_argument("--" + field.name.replace("_", "-"), type=type(field.default),
                            default=field.default)
    args = vars(parser.parse_args(argv))
    data_uri, out_dir = args.pop("data_uri"), args.pop("out_dir")
    manifest = shard_dataset(data_uri, out_dir, ShardConfig(**args))
    summary = {k: manifest[k] for k in ("examples_in", "written", "classes")}
    summary["splits"] = {s: v["count"] for s, v in manifest["splits"].items()}
    summary.update((key, manifest[key]) for key in ("skipped", "missing_classes"))
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
