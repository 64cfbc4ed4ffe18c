"""Flex-start (Vertex's Dynamic Workload Scheduler) and reservations per step: compiled into
the custom jobs and the tuning trials, refused where Vertex refuses them, and the quota
line naming the quota each draws on."""

import json

import pytest
from google.cloud import aiplatform_v1

import compile as compile_cli
from pipelines import quota
from pipelines.definitions.machine import Machine
from pipelines.definitions.scheduling import scheduling_problems, seconds, trial_scheduling

H100 = ["--train-transformer-machine-type", "a3-highgpu-1g",
        "--train-transformer-accelerator-type", "NVIDIA_H100_80GB",
        "--train-transformer-accelerator-count", "1"]
RESERVATION = "projects/acme-ml/zones/us-central1-a/reservations/h100-pool"


def _compile(tmp_path, *flags):
    names = ("transformer_pipeline", "transformer_tuning_pipeline")
    assert compile_cli.main(["--output-dir", str(tmp_path), "--pipelines", ",".join(names),
                             *flags]) == 0
    return {name: json.loads((tmp_path / f"{name}.json").read_text()) for name in names}


def _training_job(spec):
    component = spec["components"]["comp-train-transformer-classifier"]
    return {k: v.get("defaultValue") for k, v in
            component["inputDefinitions"]["parameters"].items()}


def test_an_h100_step_compiles_for_flex_start_in_its_job_and_its_trials(tmp_path, capsys):
    specs = _compile(tmp_path, *H100, "--train-transformer-scheduling-strategy", "flex-start",
                     "--train-transformer-max-wait", "2h")
    job = _training_job(specs["transformer_pipeline"])
    assert (job["strategy"], job["max_wait_duration"]) == ("FLEX_START", "7200s")
    # what the tuning launcher puts in the trials' CustomJobSpec: Vertex's own message
    executors = specs["transformer_tuning_pipeline"]["deploymentSpec"]["executors"]
    (tuner,) = [e for name, e in executors.items() if "tune" in name]
    assert {"--scheduling_strategy=FLEX_START", "--max_wait_duration=7200s"} <= set(
        tuner["container"]["args"])
    scheduling, _ = trial_scheduling(Machine("a3-highgpu-1g", "NVIDIA_H100_80GB", 1,
                                             scheduling_strategy="flex-start", max_wait="2h"),
                                     spot=False)
    parsed = aiplatform_v1.Scheduling(scheduling)
    assert parsed.strategy == aiplatform_v1.Scheduling.Strategy.FLEX_START
    assert parsed.max_wait_duration.total_seconds() == 7200
    err = capsys.readouterr().err
    assert ("quota: transformer_tuning_pipeline holds 3 x NVIDIA_H100_80GB at once "
            "(NVIDIA_H100_80GB: the preemptible GPU quota (Spot and flex-start jobs draw on "
            "it))") in err


def test_an_h100_step_compiles_for_a_reservation_in_its_job_and_its_trials(tmp_path, capsys):
    specs = _compile(tmp_path, *H100, "--train-transformer-reservation", RESERVATION)
    (pool,) = _training_job(specs["transformer_pipeline"])["worker_pool_specs"]
    affinity = pool["machine_spec"]["reservation_affinity"]
    assert affinity == {"reservation_affinity_type": "SPECIFIC_RESERVATION",
                        "key": "compute.googleapis.com/reservation-name",
                        "values": [RESERVATION]}
    # Vertex's own message takes it (protobuf JSON writes the count as a float)
    aiplatform_v1.MachineSpec({**pool["machine_spec"],
                               "accelerator_count": int(pool["machine_spec"]["accelerator_count"])})
    tuning = specs["transformer_tuning_pipeline"]
    (trial_pool,) = next(c for n, c in tuning["components"].items() if n.startswith(
        "comp-tune-"))["inputDefinitions"]["parameters"]["worker_pool_specs"]["defaultValue"]
    assert trial_pool["machine_spec"]["reservation_affinity"] == affinity
    assert quota.quotas(specs["transformer_pipeline"]) == {"NVIDIA_H100_80GB": ["reserved"]}
    assert "NVIDIA_H100_80GB: the reservation's machines" in capsys.readouterr().err


@pytest.mark.parametrize("flags, message", [
    (["--train-text-scheduling-strategy", "flex-start"],
     "--train-text-scheduling-strategy flex-start: Vertex's flex-start provisions L4, A100, "
     "H100, H200 and B200 machines only; this step has NVIDIA_TESLA_T4"),
    ([*H100, "--train-transformer-scheduling-strategy", "flex-start", "--step-timeout",
      "700000"], "a flex-start job runs at most 7 days; --step-timeout is 700000s"),
    (["--train-text-max-wait", "2h"],
     "--train-text-max-wait is how long a flex-start job waits for its machines"),
    ([*H100, "--train-transformer-scheduling-strategy", "flex-start",
      "--train-transformer-reservation", "any"], "a flex-start job does not use reservations"),
    (["--spot", "--train-text-reservation", RESERVATION], "a spot job does not use reservations"),
    (["--train-text-reservation", "h100-pool"], "--train-text-reservation takes 'any' or "
                                                "projects/PROJECT/zones/ZONE/reservations/NAME"),
    (["--train-text-scheduling-strategy", "dws"], "must be one of ['flex-start', 'spot', "
                                                  "'standard']"),
])
def test_scheduling_vertex_would_refuse_is_refused_at_compile(tmp_path, flags, message):
    with pytest.raises(SystemExit) as exit_:
        compile_cli.main(["--output-dir", str(tmp_path), *flags])
    assert message in str(exit_.value)


def test_a_step_overrides_spot_and_durations_read_their_units():
    machine = Machine("g2-standard-8", "NVIDIA_L4", 1, scheduling_strategy="standard")
    assert scheduling_problems("train_text", machine, spot=True, timeout_s=3600) == []
    assert trial_scheduling(machine, spot=True) == ({}, {})
    assert trial_scheduling(Machine("n1-standard-8", "NVIDIA_TESLA_T4", 1), spot=True) == (
        {"strategy": "SPOT"}, {})
    assert [seconds(d) for d in ("90m", "2h", "1d", "3600s", "45")] == [5400, 7200, 86400,
                                                                        3600, 45]
