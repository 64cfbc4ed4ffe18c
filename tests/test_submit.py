"""`python -m pipelines.submit`: the request it sends to Vertex AI, built offline.

Everything runs for real up to the Vertex service itself, which cannot exist here: the
compiled pipeline, the SDK's PipelineJob / PipelineJobSchedule and their GAPIC clients
(anonymous credentials, no network). Where a test sends, the gRPC stub of the one RPC is
replaced and the request proto it receives is asserted; the SDK's check of the pipeline
root bucket talks to the GCS emulator (tests/conftest.py).
"""

import json

import pytest
from google.auth.credentials import AnonymousCredentials
from google.cloud import aiplatform
from google.cloud.aiplatform.utils import resource_manager_utils
from google.cloud.aiplatform_v1.services.pipeline_service.transports.grpc import (
    PipelineServiceGrpcTransport,
)
from google.cloud.aiplatform_v1.services.schedule_service.transports.grpc import (
    ScheduleServiceGrpcTransport,
)
from google.cloud.aiplatform_v1.types import PipelineJob, Schedule
from google.protobuf import json_format

import compile as compile_cli
from pipelines import submit
from tests.kfp_api import KfpApiStub

PROJECT = "acme-ml"
REGION = "europe-west4"
BUCKET = "acme-ml-pipelines"
ROOT = f"gs://{BUCKET}/root"
SA = "runner@acme-ml.iam.gserviceaccount.com"
NETWORK = "projects/123456/global/networks/ml"
KEY = f"projects/{PROJECT}/locations/{REGION}/keyRings/ml/cryptoKeys/pipelines"


@pytest.fixture(scope="module")
def pipeline_json(tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("build")
    assert compile_cli.main(["--output-dir", str(out), "--registry",
                             "europe-west4-docker.pkg.dev/p/r", "--tag", "abc1234",
                             "--pipelines", "image_pipeline"]) == 0
    return str(out / "image_pipeline.json")


def _argv(template, *extra):
    return [template, "--project", PROJECT, "--region", REGION, "--pipeline-root", ROOT,
            "--param", "data_uri=gs://acme-ml-data/pets", *extra]


def _plan(template, *extra) -> submit.Submission:
    return submit.plan(submit.parser().parse_args(_argv(template, *extra)))


def _described(template, *flags) -> dict:
    """The request the dry run prints for these flags (`submit.describe`)."""
    plan = _plan(template, *flags)
    job = submit.build_job(plan, credentials=AnonymousCredentials())
    schedule = plan.schedule and submit.build_schedule(job, plan,
                                                       credentials=AnonymousCredentials())
    return submit.describe(plan, job, schedule or None)


# ---------------------------------------------------------------- parameters

def test_params_take_the_types_the_pipeline_declares(pipeline_json):
    declared = submit.declared_parameters(submit.load_pipeline_spec(pipeline_json))
    values = submit.parse_params(
        ["data_uri=gs://b/pets", "image_size=160", "max_skipped_fraction=0.1",
         "train_fraction=1", "resize_method=pad", "seed=007"], declared)
    assert values == {"data_uri": "gs://b/pets", "image_size": 160,
                      "max_skipped_fraction": 0.1, "train_fraction": 1.0,
                      "resize_method": "pad", "seed": 7}
    assert type(values["image_size"]) is int and type(values["train_fraction"]) is float


@pytest.mark.parametrize("ptype, text, expected", [
    ("BOOLEAN", "true", True), ("BOOLEAN", "No", False), ("BOOLEAN", "1", True),
    ("LIST", '["a", 2]', ["a", 2]), ("STRUCT", '{"lr": 0.1}', {"lr": 0.1}),
    ("STRING", "a=b", "a=b"), ("NUMBER_DOUBLE", "1e-3", 0.001),
])
def test_other_declared_types_convert(ptype, text, expected):
    declared = {"p": {"parameterType": ptype, "defaultValue": None}}
    assert submit.parse_params([f"p={text}"], declared) == {"p": expected}


@pytest.mark.parametrize("ptype, text, message", [
    ("NUMBER_INTEGER", "1.5", "expected a whole number"),
    ("NUMBER_INTEGER", "big", "expected a whole number"),
    ("NUMBER_DOUBLE", "nan", "finite"),
    ("NUMBER_DOUBLE", "x", "expected a finite number"),
    ("BOOLEAN", "maybe", "true or false"),
    ("LIST", '{"a": 1}', "JSON list"),
    ("STRUCT", "[1]", "JSON object"),
])
def test_bad_values_are_refused(ptype, text, message):
    declared = {"p": {"parameterType": ptype, "defaultValue": None}}
    with pytest.raises(submit.SubmitError, match=message):
        submit.parse_params([f"p={text}"], declared)


def test_unknown_param_names_the_valid_ones_and_a_required_one_left_out_is_named(pipeline_json):
    declared = submit.declared_parameters(submit.load_pipeline_spec(pipeline_json))
    with pytest.raises(submit.SubmitError) as e:
        submit.parse_params(["data_uri=gs://b/x", "imagesize=3"], declared)
    assert "'imagesize'" in str(e.value)
    valid = str(e.value).split("takes: ")[1].split(", ")
    assert valid == sorted(declared) and "image_size" in valid
    with pytest.raises(submit.SubmitError, match=r"--param data_uri=\.\.\."):
        submit.parse_params(["image_size=3"], declared)


def test_labels_parse_and_follow_gcp_rules():
    assert submit.parse_labels(["team=ml,env=dev", "run=nightly"]) == {
        "team": "ml", "env": "dev", "run": "nightly"}
    for bad in ("Team=ml", "team", "1team=x", "team=ML"):
        with pytest.raises(submit.SubmitError):
            submit.parse_labels([bad])


# ---------------------------------------------------------------- the request, not sent

def test_built_job_is_the_request_vertex_gets(pipeline_json):
    plan = _plan(pipeline_json, "--param", "image_size=160", "--param", "resize_method=160",
                 "--param", "max_skipped_fraction=0.2", "--display-name", "pets-nightly",
                 "--service-account", SA, "--network", NETWORK, "--encryption-key", KEY,
                 "--labels", "team=ml,env=dev", "--no-cache", "--failure-policy", "fast")
    job = submit.build_job(plan, credentials=AnonymousCredentials())
    request = submit.describe(plan, job)
    assert request["displayName"] == "pets-nightly"
    assert request["runtimeConfig"]["gcsOutputDirectory"] == ROOT
    # google.protobuf.Value's JSON: a number (a float) is what Vertex receives
    values = request["runtimeConfig"]["parameterValues"]
    assert values["data_uri"] == "gs://acme-ml-data/pets"
    assert values["image_size"] == 160 and type(values["image_size"]) is float
    # the same text, declared a string, stays a string
    assert values["resize_method"] == "160"
    assert values["max_skipped_fraction"] == pytest.approx(0.2)
    assert "seed" not in values  # left to the pipeline's default
    assert request["serviceAccount"] == SA
    assert request["network"] == NETWORK
    assert request["labels"] == {"team": "ml", "env": "dev"}
    assert request["encryptionSpec"]["kmsKeyName"] == KEY
    assert request["runtimeConfig"]["failurePolicy"] == "PIPELINE_FAILURE_POLICY_FAIL_FAST"
    tasks = job.to_dict()["pipelineSpec"]["root"]["dag"]["tasks"]
    assert tasks and all(t["cachingOptions"]["enableCache"] is False for t in tasks.values())


def test_defaults_leave_caching_and_optional_fields_alone(pipeline_json):
    plan = _plan(pipeline_json)
    job = submit.build_job(plan, credentials=AnonymousCredentials())
    request = submit.describe(plan, job)
    assert request["displayName"] == "image-classifier"  # the pipeline's name
    assert not {"serviceAccount", "network", "labels", "encryptionSpec"} & set(request)
    assert "failurePolicy" not in request["runtimeConfig"]  # Vertex's default: slow
    tasks = job.to_dict()["pipelineSpec"]["root"]["dag"]["tasks"]
    assert all(t.get("cachingOptions", {}).get("enableCache", True) for t in tasks.values())


def test_schedule_holds_the_cron_and_the_job_it_starts(pipeline_json):
    resource = _described(pipeline_json, "--schedule", "TZ=Europe/Amsterdam 0 3 * * 1",
                          "--service-account", SA, "--network", NETWORK, "--labels", "team=ml",
                          "--encryption-key", KEY, "--param", "image_size=96",
                          "--failure-policy", "slow")
    assert resource["cron"] == "TZ=Europe/Amsterdam 0 3 * * 1"
    assert resource["displayName"] == "image-classifier"
    assert resource["maxConcurrentRunCount"] == "1"
    inner = resource["createPipelineJobRequest"]
    assert inner["parent"] == f"projects/{PROJECT}/locations/{REGION}"
    assert inner["pipelineJob"]["runtimeConfig"]["gcsOutputDirectory"] == ROOT
    assert inner["pipelineJob"]["runtimeConfig"]["parameterValues"]["image_size"] == 96
    assert (inner["pipelineJob"]["runtimeConfig"]["failurePolicy"]
            == "PIPELINE_FAILURE_POLICY_FAIL_SLOW")
    assert inner["pipelineJob"]["serviceAccount"] == SA
    assert inner["pipelineJob"]["network"] == NETWORK
    assert inner["pipelineJob"]["labels"] == {"team": "ml"}
    assert inner["pipelineJob"]["encryptionSpec"]["kmsKeyName"] == KEY
    assert "pipelineSpec" not in inner["pipelineJob"]


def test_yaml_pipelines_are_read_too(tmp_path):
    assert compile_cli.main(["--output-dir", str(tmp_path), "--yaml", "--registry",
                             "europe-west4-docker.pkg.dev/p/r", "--tag", "abc1234",
                             "--pipelines", "image_pipeline"]) == 0
    plan = _plan(str(tmp_path / "image_pipeline.yaml"), "--param", "seed=3")
    assert plan.parameter_values["seed"] == 3


def test_dry_run_prints_the_request_without_credentials_and_the_gpus_held(pipeline_json,
                                                                           capsys):
    assert submit.main(_argv(pipeline_json, "--param", "image_size=64", "--labels", "a=b",
                             "--dry-run")) == 0
    out, err = capsys.readouterr()
    request = json.loads(out)  # the request alone on stdout
    assert request["runtimeConfig"]["parameterValues"] == {
        "data_uri": "gs://acme-ml-data/pets", "image_size": 64.0}
    assert request["labels"] == {"a": "b"}
    assert "pipelineSpec" not in request
    assert f"quota: this run holds 2 x NVIDIA_TESLA_V100 at once in {REGION}" in err


# ---------------------------------------------------------------- bad input: exit code 2

@pytest.mark.parametrize("extra, message", [
    (["--param", "num_epochs=3"],
     "unknown parameter 'num_epochs'; this pipeline takes: architecture, batch_size, "
     "checkpoint_every_steps, data_uri"),
    (["--param", "image_size=big"], "image_size: expected a whole number"),
    (["--param", "image_size"], "name=value"),
    (["--param", "seed=1", "--param", "seed=2"], "given twice"),
    (["--pipeline-root", "/tmp/root"], "--pipeline-root must be a Cloud Storage folder"),
    (["--pipeline-root", "s3://bucket/root"], "--pipeline-root must be a Cloud Storage folder"),
    (["--schedule", "every monday"], "cron expression of 5 fields"),
    (["--schedule", "0 3 * * 1", "--experiment", "pets"], "cannot be combined"),
    (["--network", "projects/acme-ml/global/networks/ml"], "PROJECT_NUMBER"),
    (["--encryption-key", "projects/p/locations/us-central1/keyRings/r/cryptoKeys/k"],
     "in the run's region"),
    (["--encryption-key", "my-key"], "--encryption-key takes"),
    (["--labels", "Team=ml"], "label key 'Team'"),
    (["--service-account", "runner"], "service account email"),
    (["--region", "Europe"], "--region takes"),
    (["--experiment", "Pets_2024"], "--experiment"),
    (["--failure-policy", "never"], "--failure-policy: invalid choice"),
])
def test_bad_input_exits_2_with_a_clear_message(pipeline_json, capsys, extra, message):
    with pytest.raises(SystemExit) as e:
        submit.main(_argv(pipeline_json, *extra))
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_a_vertex_file_is_refused_for_kubeflow(pipeline_json, capsys):
    assert submit.main(["--target", "kubeflow", pipeline_json, "--host",
                        "http://127.0.0.1:9"]) == 2
    assert "compiled for Vertex" in capsys.readouterr().err


def test_a_file_that_is_not_a_compiled_pipeline_exits_2(tmp_path, capsys):
    bogus = tmp_path / "p.json"
    bogus.write_text('{"hello": 1}')
    for template in (str(bogus), str(tmp_path / "missing.json")):
        with pytest.raises(SystemExit) as e:
            submit.main(_argv(template))
        assert e.value.code == 2
    err = capsys.readouterr().err
    assert "not a compiled pipeline" in err and "cannot read" in err


# ---------------------------------------------------------------- sending, Vertex stubbed

class _Rpc:
    """Stands in for the gRPC stub of one Vertex RPC (the service cannot exist here)."""

    def __init__(self, reply):
        self.reply = reply
        self.requests = []

    def __call__(self, request, **kwargs):
        self.requests.append(request)
        return self.reply(request)


@pytest.fixture
def pipeline_bucket(gcs, monkeypatch):
    """The pipeline root's bucket in the GCS emulator, owned by PROJECT.

    The SDK checks the bucket belongs to the project before it submits; the project
    number comes from Resource Manager, which cannot exist here either.
    """
    bucket = gcs.bucket(BUCKET)
    if not bucket.exists():
        bucket = gcs.create_bucket(BUCKET)
    bucket.reload()
    monkeypatch.setattr(resource_manager_utils, "get_project_number",
                        lambda project, credentials=None: str(bucket.project_number))
    return bucket


def test_submit_sends_the_request_the_dry_run_describes(pipeline_json, pipeline_bucket,
                                                        monkeypatch, capsys, caplog):
    def created(request):
        job = PipelineJob.wrap(PipelineJob.pb(request.pipeline_job))
        job.name = f"{request.parent}/pipelineJobs/{request.pipeline_job_id}"
        return job

    rpc = _Rpc(created)
    monkeypatch.setattr(PipelineServiceGrpcTransport, "create_pipeline_job",
                        property(lambda self: rpc))
    flags = ("--param", "image_size=128", "--service-account", SA, "--network", NETWORK,
             "--labels", "team=ml", "--encryption-key", KEY, "--failure-policy", "fast")
    assert submit.main(_argv(pipeline_json, *flags), credentials=AnonymousCredentials()) == 0
    [request] = rpc.requests
    assert request.parent == f"projects/{PROJECT}/locations/{REGION}"
    assert request.pipeline_job_id.startswith("image-classifier-")
    sent = json_format.MessageToDict(PipelineJob.pb(request.pipeline_job))
    del sent["name"]  # the stub's reply's
    assert sent.pop("pipelineSpec")["pipelineInfo"]["name"] == "image-classifier"
    assert sent == _described(pipeline_json, *flags)
    # Each line stripped: in clean-clone runs 16 and 4 spaces from elsewhere in the
    # process (not submit's prints) preceded the name or the link on stdout.
    out = [line.strip() for line in capsys.readouterr().out.splitlines() if line.strip()]
    name = f"projects/{PROJECT}/locations/{REGION}/pipelineJobs/{request.pipeline_job_id}"
    assert out[0] == name
    assert out[1].startswith(
        f"https://console.cloud.google.com/vertex-ai/locations/{REGION}/pipelines/runs/")
    # the SDK's bucket check passed against the emulator (it logs, not raises, on failure)
    assert not [r for r in caplog.records if r.levelname == "ERROR"]


def test_schedule_creates_a_schedule_and_starts_no_run(pipeline_json, monkeypatch, capsys):
    def created(request):
        schedule = Schedule.wrap(Schedule.pb(request.schedule))
        schedule.name = f"{request.parent}/schedules/987"
        return schedule

    schedule_rpc = _Rpc(created)
    run_rpc = _Rpc(lambda request: pytest.fail("a schedule must not start a run now"))
    monkeypatch.setattr(ScheduleServiceGrpcTransport, "create_schedule",
                        property(lambda self: schedule_rpc))
    monkeypatch.setattr(PipelineServiceGrpcTransport, "create_pipeline_job",
                        property(lambda self: run_rpc))
    flags = ("--schedule", "0 3 * * 1", "--service-account", SA, "--display-name", "pets-weekly")
    assert submit.main(_argv(pipeline_json, *flags), credentials=AnonymousCredentials()) == 0
    [request] = schedule_rpc.requests
    assert request.parent == f"projects/{PROJECT}/locations/{REGION}"
    sent = json_format.MessageToDict(Schedule.pb(request.schedule))
    del sent["name"]  # the stub's reply's
    assert sent["createPipelineJobRequest"]["pipelineJob"].pop("pipelineSpec")
    assert sent == _described(pipeline_json, *flags)
    assert capsys.readouterr().out.strip().startswith(  # stripped: as above
        f"projects/{PROJECT}/locations/{REGION}/schedules/987\n")


def test_experiment_is_passed_to_submit(pipeline_json, monkeypatch):
    # Linking a run to an experiment is a series of Vertex Metadata calls made by the SDK
    # after the run exists: stop at the SDK's submit() and check what it was given.
    calls = []
    monkeypatch.setattr(aiplatform.PipelineJob, "submit", lambda self, **kw: calls.append(kw))
    monkeypatch.setattr(aiplatform.PipelineJob, "resource_name", property(
        lambda self: f"projects/{PROJECT}/locations/{REGION}/pipelineJobs/x"))
    assert submit.main(_argv(pipeline_json, "--experiment", "pets-densenet"),
                       credentials=AnonymousCredentials()) == 0
    assert calls == [{"service_account": None, "network": None, "experiment": "pets-densenet"}]


# ---------------------------------------------------------------- regions


def test_a_tensorboard_or_key_compiled_for_another_region_is_refused(tmp_path, capsys):
    board = "projects/acme-ml/locations/us-central1/tensorboards/123"
    key = f"projects/{PROJECT}/locations/us-central1/keyRings/ml/cryptoKeys/jobs"
    assert compile_cli.main(["--output-dir", str(tmp_path), "--registry",
                             "europe-west4-docker.pkg.dev/p/r", "--tag", "abc1234",
                             "--tensorboard", board, "--service-account", SA,
                             "--base-output-directory", "gs://acme-us/jobs",
                             "--encryption-key", key, "--pipelines", "image_pipeline"]) == 0
    template = str(tmp_path / "image_pipeline.json")
    assert submit.compiled_regions(submit.load_pipeline_spec(template)) == {
        board: "us-central1", key: "us-central1"}
    with pytest.raises(SystemExit) as exit_:
        submit.main(_argv(template, "--dry-run"))
    assert exit_.value.code == 2
    message = capsys.readouterr().err
    assert f"compiled with {key} (in us-central1); {board} (in us-central1)" in message
    assert "submit with --region us-central1, or compile again" in message
    assert submit.main([template, "--project", PROJECT, "--region", "us-central1",
                        "--pipeline-root", ROOT, "--param", "data_uri=gs://d/pets",
                        "--dry-run"]) == 0


@pytest.mark.parametrize("location, region, inside", [
    ("EUROPE-WEST4", "europe-west4", True), ("US-CENTRAL1", "europe-west4", False),
    ("EU", "europe-west4", True), ("EU", "us-central1", False), ("US", "us-east4", True),
    ("NAM4", "us-central1", True), ("NAM4", "us-west1", False), ("XY-NEW9", "us-east1", False),
    ("MARS1", "us-east1", None)])
def test_bucket_locations_are_held_to_the_run_region(location, region, inside):
    assert submit.in_region(location, region) is inside


def test_inputs_in_another_region_are_warned_about_not_refused(gcs):
    """The GCS emulator keeps no location (every bucket is "US"): the locations here are
    a stand-in for the API's answers; the real lookup is checked against the emulator."""
    where = {"data-in-us": "US-CENTRAL1", "data-in-eu": "EU"}

    def locate(bucket):
        if bucket not in where:
            raise PermissionError(bucket)
        return where[bucket]

    warnings = submit.bucket_warnings(
        ["gs://data-in-us/pets", "gs://data-in-eu/x", "/local", 3, "gs://nowhere-xyz/a"],
        "europe-west4", locate)
    assert warnings[0].startswith("bucket 'data-in-us' is in US-CENTRAL1, not in the run's "
                                  "region europe-west4: its data is read across regions")
    assert warnings[1] == ("could not read the location of bucket 'nowhere-xyz' "
                           "(PermissionError): not compared with europe-west4")
    assert len(warnings) == 2
    if not gcs.bucket("data-in-us").exists():
        gcs.create_bucket("data-in-us")
    plan = submit.Submission(template_path="", project=PROJECT, region=REGION,
                             pipeline_root=ROOT, parameter_values={}, display_name="x")
    assert submit._bucket_locator(plan, AnonymousCredentials())("data-in-us") == "US"


# --------------------------------------------------------------------------- Kubeflow: retry


def test_kubeflow_retry_continues_a_failed_run_through_kfps_retry_endpoint(
        tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))  # kfp.Client's context file
    token = tmp_path / "token"
    token.write_text("secret-token\n")
    stub = KfpApiStub({"run-7": "FAILED", "run-8": "SUCCEEDED"})
    try:
        assert submit.main(["--target", "kubeflow", "--retry", "run-7", "--host", stub.url,
                            "--namespace", "team-a", "--token-file", str(token)]) == 0
        assert "retrying run run-7 (image-classifier)" in capsys.readouterr().out
        retries = [r for r in stub.requests if r["method"] == "POST"]
        assert [r["path"] for r in retries] == ["/apis/v2beta1/runs/run-7:retry"]
        assert retries[0]["auth"] == "Bearer secret-token"
        # a run that succeeded is not KFP's to retry: refused before anything is sent
        assert submit.main(["--target", "kubeflow", "--retry", "run-8", "--host",
                            stub.url]) == 2
        assert "is SUCCEEDED: KFP retries a failed or terminated run only" in \
            capsys.readouterr().err
        assert submit.main(["--target", "kubeflow", "--retry", "run-9", "--host",
                            stub.url]) == 1  # no such run: the server's answer, named
        assert "KFP did not retry run run-9: 404" in capsys.readouterr().err
        assert [r["path"] for r in stub.requests if r["method"] == "POST"] == [
            "/apis/v2beta1/runs/run-7:retry"]
    finally:
        stub.close()


def test_kubeflow_retry_takes_no_pipeline_and_says_what_it_keeps(capsys):
    from pipelines import submit_kubeflow

    for argv in (["--retry", "run-7", "build/x.yaml", "--host", "http://127.0.0.1:9"],
                 ["--host", "http://127.0.0.1:9"]):
        with pytest.raises(SystemExit):
            submit_kubeflow.main(argv)
        assert "either the compiled pipeline or --retry RUN_ID" in capsys.readouterr().err
    assert submit_kubeflow.main(["--retry", "run-7", "--host", "http://127.0.0.1:9",
                                 "--param", "seed=3"]) == 2
    assert "--retry keeps the run's parameters" in capsys.readouterr().err
    assert submit_kubeflow.main(["--retry", "run-7", "--host", "http://127.0.0.1:9",
                                 "--dry-run"]) == 0
    assert json.loads(capsys.readouterr().out)["retry"] == "run-7"
    help_text = " ".join(submit_kubeflow.parser().format_help().split())
    assert "its finished steps are kept and the others run again" in help_text
    assert "resumes from its checkpoints when compiled with --checkpoint-root" in help_text
