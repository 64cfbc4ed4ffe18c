"""What a pipeline's tracking step logged, read back through MLflow's own client."""

from __future__ import annotations

import json
import os
import pathlib

from components.track.tracking import RUN_TAG


def only_run(client, experiment: str, run_name: str):
    """The one run of `experiment` tagged with the pipeline run `run_name`."""
    (run,) = client.search_runs(
        [client.get_experiment_by_name(experiment).experiment_id],
        filter_string=f"tags.{RUN_TAG} = '{run_name}'")
    return run


def metric_history(client, run, key: str) -> list[tuple[int, float]]:
    """`(step, value)` of every logged value of `key`, by step."""
    return [(m.step, m.value) for m in sorted(client.get_metric_history(run.info.run_id, key),
                                              key=lambda m: m.step)]


def model_metadata(pipeline_root: pathlib.Path) -> dict:
    """The trained artifact's metadata as kfp.local recorded it (the training step's
    executor output under `pipeline_root`)."""
    (path,) = [os.path.join(root, "executor_output.json")
               for root, _, files in os.walk(pipeline_root)
               if "executor_output.json" in files and os.path.basename(root).startswith("train")]
    artifacts = json.loads(open(path).read())["artifacts"]
    name = "lm_assets" if "lm_assets" in artifacts else "model"
    return artifacts[name]["artifacts"][0]["metadata"]
