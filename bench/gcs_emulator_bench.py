"""Reading a bucket through the Cloud Storage emulator, as rehearsals do, measured side by side.

    python bench/gcs_emulator_bench.py [--files 600]

speed-up = files/s of gcsfs's batched read (`cat_ranges`, as sharding and prediction read)
    through `tools.rehearsal.gcs_api`'s emulator (listen backlog 1024) / through the emulator as
    it ships (backlog 5: the kernel drops the SYNs past it). Target: a few thousand files
    in a few minutes, i.e. >= 20 files/s.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tools.datamakers import demo  # noqa: E402
from tools.rehearsal import gcs_api  # noqa: E402


def files_per_second(module: str, folder: str, limit: int, logs: str) -> float:
    """Starts `python -m MODULE start` (`gcs_api.start_emulator`), seeds `folder`, reads up to
    `limit` files."""
    process, url = gcs_api.start_emulator(logs, module)
    try:
        gcs_api.seed(url, folder)
        import gcsfs

        # One filesystem per emulator (gcsfs caches instances across endpoints).
        fs = gcsfs.GCSFileSystem(token="anon", endpoint_url=url, skip_instance_cache=True)
        files = sorted(fs.find("bench/digits"))[:limit]
        started = time.monotonic()
        fs.cat_ranges(files, [None] * len(files), [None] * len(files), on_error="return")
        return len(files) / (time.monotonic() - started)
    finally:
        gcs_api.stop(process)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--files", type=int, default=600)
    args = p.parse_args()
    # As components.common.storage: no zonal-bucket probe (a gRPC call the emulator lacks).
    os.environ["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] = "false"
    with tempfile.TemporaryDirectory() as folder, tempfile.TemporaryDirectory() as logs:
        demo.write_digits(os.path.join(folder, "bench", "digits"),
                          per_class=max(1, args.files // 10))
        ours = files_per_second("tools.rehearsal.gcs_api", folder, args.files, logs)
        # The shipped server crawls: a fifth of the files tells its rate.
        shipped = files_per_second("gcp_storage_emulator", folder, max(20, args.files // 5), logs)
    print(f"files/s: tools.rehearsal.gcs_api {ours:.1f}, gcp-storage-emulator as shipped "
          f"{shipped:.1f}; speed-up {ours / shipped:.0f}x "
          f"({'meets' if ours >= 20 else 'MISSES'} >= 20 files/s)")


if __name__ == "__main__":
    main()
