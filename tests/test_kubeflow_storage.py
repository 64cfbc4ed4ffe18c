"""s3:// data for the Kubeflow target: listed and read through s3fs from a real S3 API on
loopback (moto's server), as tests/test_gcs_input.py does for gs:// with an emulator.

AWS itself cannot be reached here; moto's server answers S3's REST API on 127.0.0.1, and
the code under test talks to it as to MinIO or Ceph (`AWS_ENDPOINT_URL`).
"""

import dataclasses
import json
import os
import subprocess
import sys

import pytest

from components.preflight.data import data_fingerprint
from components.prepare_text.contract import PrepareConfig
from components.prepare_text.preparation import prepare_text_dataset
from components.shard.contract import ShardingError
from components.shard.sharding import ShardConfig, list_labelled_files
from tests.conftest import free_port, plant_bad_files, write_class_images

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
S3_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
          "AWS_DEFAULT_REGION": "us-east-1"}


@pytest.fixture
def s3(s3_endpoint, monkeypatch):
    """A boto3 client of the loopback server, emptied (tests reuse bucket names and may run
    in any order), with the environment the steps read."""
    import urllib.request

    import boto3
    import fsspec

    urllib.request.urlopen(urllib.request.Request(f"{s3_endpoint}/moto-api/reset",
                                                  method="POST"), timeout=30).close()

    for name, value in {**S3_ENV, "AWS_ENDPOINT_URL": s3_endpoint}.items():
        monkeypatch.setenv(name, value)
    fsspec.filesystem("s3").clear_instance_cache()  # s3fs caches per endpoint settings
    return boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1")


def _upload(client, bucket, root, prefix):
    client.create_bucket(Bucket=bucket)
    for folder, _, files in os.walk(root):
        for name in files:
            path = os.path.join(folder, name)
            client.upload_file(path, bucket, prefix + os.path.relpath(path, root))


def _shard_as_a_step(uri: str, out: str, config: ShardConfig) -> dict:
    """The manifest of the sharding step's own command, run in a new interpreter: forked
    from this process (the S3 server's threads, earlier tests' TensorFlow pools), a worker
    can inherit a lock held at the fork and wait for ever (a CI run's did, past its timeout)."""
    flags = [f"--{name.replace('_', '-')}={value}"
             for name, value in dataclasses.asdict(config).items()]
    run = subprocess.run([sys.executable, "-m", "components.shard", uri, out, *flags],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    with open(os.path.join(out, "manifest.json")) as f:
        return json.load(f)


def test_kubeflow_shards_an_s3_folder_like_a_local_one(s3, tmp_path):
    root = str(tmp_path / "images")
    write_class_images(root, per_class=6)
    bad = plant_bad_files(root)
    _upload(s3, "train-data", root, "datasets/pets/")
    config = ShardConfig(image_size=16, min_shards_per_split=2, max_skipped_fraction=0.5,
                         num_workers=2)
    remote = _shard_as_a_step("s3://train-data/datasets/pets", str(tmp_path / "remote"), config)
    here = _shard_as_a_step(root, str(tmp_path / "here"), config)
    assert remote["input_uri"] == "s3://train-data/datasets/pets"
    assert remote["classes"] == ["cat", "dog", "eel"]
    assert {s["path"] for s in remote["skipped"]} == set(bad)
    assert remote["splits"] == here["splits"]  # the same bytes whichever way they came
    # the preflight's fingerprint of the folder is the same data's
    assert data_fingerprint("s3://train-data/datasets/pets")


def test_kubeflow_missing_s3_folder_is_a_clear_error(s3):
    s3.create_bucket(Bucket="empty-bucket")
    with pytest.raises(ShardingError, match="s3://empty-bucket/nothing-here.*does not exist"):
        list_labelled_files("s3://empty-bucket/nothing-here")


def test_kubeflow_prepares_an_s3_csv(s3, tmp_path):
    rows = ["text,label"] + [f"a review number {i} about the {w},{w}"
                             for i in range(40) for w in (("price", "delivery")[i % 2],)]
    local = tmp_path / "reviews.csv"
    local.write_text("\n".join(rows) + "\n")
    s3.create_bucket(Bucket="texts")
    s3.upload_file(str(local), "texts", "in/reviews.csv")
    config = PrepareConfig(text_column="text", label_columns=("label",))
    remote = prepare_text_dataset("s3://texts/in/reviews.csv", str(tmp_path / "r"), config)
    here = prepare_text_dataset(str(local), str(tmp_path / "h"), config)
    assert remote["labels"] == here["labels"] == ["delivery", "price"]
    assert remote["splits"] == here["splits"]
    assert remote["source_sha256"] == here["source_sha256"]
    assert remote["source"] == "s3://texts/in/reviews.csv"


@pytest.fixture
def mirrors(monkeypatch, tmp_path):
    """No mirror of an earlier test (a new process starts with none), in a temporary
    folder of this test's (a new pod's /tmp)."""
    import tempfile

    from components.common import storage

    monkeypatch.setattr(storage, "_MIRRORS", {})
    monkeypatch.setattr(storage, "PUSH_BACKOFF_S", 0.01)  # seconds in a pod; not here
    (tmp_path / "pod-tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "pod-tmp"))
    monkeypatch.delenv("RANK", raising=False)
    return storage


def _write(folder, rel, text):
    os.makedirs(os.path.dirname(os.path.join(folder, rel)), exist_ok=True)
    with open(os.path.join(folder, rel), "w") as f:
        f.write(text)


def _keys(client, bucket: str) -> list[str]:
    return sorted(k["Key"] for k in client.list_objects_v2(Bucket=bucket)["Contents"])


def test_kubeflow_checkpoint_folder_mirrors_s3_and_a_new_pod_finds_it(s3, mirrors, tmp_path):
    s3.create_bucket(Bucket="ckpt")
    environ = {"AIP_CHECKPOINT_DIR": "s3://ckpt/root"}
    output = str(tmp_path / "pod" / "run-1" / "train" / "model")
    folder = mirrors.run_folder("AIP_CHECKPOINT_DIR", output, None, environ)
    assert not folder.startswith(str(tmp_path / "pod") + os.sep) and os.path.isdir(folder)
    _write(folder, "weights.pth", "epoch 1")
    _write(folder, ".tmp-state.json.x", "half a file")
    from components.common import run_state

    run_state.save(folder, "state.json", {"fingerprint": "f", "epochs_done": 1})
    assert _keys(s3, "ckpt") == ["root/run-1/train/state.json", "root/run-1/train/weights.pth"]
    # the trainer replaces its checkpoint: the old one goes from the bucket too
    os.remove(os.path.join(folder, "weights.pth"))
    _write(folder, "weights-2.pth", "epoch 2")
    run_state.save(folder, "state.json", {"fingerprint": "f", "epochs_done": 2})
    assert _keys(s3, "ckpt") == ["root/run-1/train/state.json", "root/run-1/train/weights-2.pth"]
    # a retried pod: nothing local, the same task's output path
    import shutil

    mirrors._MIRRORS.clear()
    shutil.rmtree(folder)
    again = mirrors.run_folder("AIP_CHECKPOINT_DIR", output, None, environ)
    assert mirrors.read_json(os.path.join(again, "state.json"))["epochs_done"] == 2
    with open(os.path.join(again, "weights-2.pth")) as f:
        assert f.read() == "epoch 2"


def test_kubeflow_gs_is_mirrored_only_where_it_is_not_mounted(mirrors, monkeypatch):
    environ = {"AIP_CHECKPOINT_DIR": "gs://b/root"}
    output = "/gcs/b/root/run-1/train/model"
    assert mirrors.run_folder("AIP_CHECKPOINT_DIR", output, None, environ) == \
        mirrors.local_path("gs://b/root") + "/run-1/train"  # Vertex's FUSE mount
    assert mirrors._MIRRORS == {}
    made = []
    monkeypatch.setattr(mirrors, "mirrored_folder", lambda remote: made.append(remote) or "x")
    environ["OBJECT_STORE_MOUNTED"] = "0"  # open-source KFP: /gcs is a scratch folder
    assert mirrors.run_folder("AIP_CHECKPOINT_DIR", output, None, environ) == "x"
    assert made == ["gs://b/root/run-1/train"]


def test_kubeflow_mirror_retries_a_failed_upload_pushes_pointers_last_and_only_from_rank_0(
        s3, mirrors, monkeypatch, caplog):
    """An upload that fails once, then succeeds: the push tries again from that file on and
    everything lands, with no error; one that keeps failing fails after its attempts. The
    failure is a stand-in for a store's transient one (an OSError from the filesystem's
    `put`, as s3fs raises after its own retries)."""
    s3.create_bucket(Bucket="ckpt")
    folder = mirrors.mirrored_folder("s3://ckpt/job/task")
    (mirror,) = mirrors._MIRRORS.values()
    for rel in ("backup/chief/checkpoint", "backup/chief/ckpt-1.index",
                "backup/chief/ckpt-1.data-00000-of-00001", "run.json"):
        _write(folder, rel, rel)
    order, put, failures = [], mirror.fs.put, [OSError("503 Slow Down")]  # the next puts'

    def flaky_put(local, remote):
        order.append(remote.split("task/")[1])
        if failures:
            raise failures.pop()
        put(local, remote)

    monkeypatch.setattr(mirror.fs, "put", flaky_put)
    mirrors.push_mirrors(os.path.join(folder, "backup"))
    assert order[0] == order[1]  # the failed file, tried again; then on from there
    assert set(order[1:3]) == {"backup/chief/ckpt-1.data-00000-of-00001",
                               "backup/chief/ckpt-1.index"}
    assert set(order[3:]) == {"backup/chief/checkpoint", "run.json"}  # pointers last
    assert set(_keys(s3, "ckpt")) == {f"job/task/{rel}" for rel in order}
    assert "503 Slow Down" in caplog.text  # the try that failed is in the log
    order.clear()
    failures.extend([OSError("503 Slow Down")] * 4)  # the store is down for 4 tries
    _write(folder, "weights.pth", "epoch 1")
    with pytest.raises(mirrors.CheckpointStoreError,
                       match=r"pushing .* to s3://ckpt/job/task .*503 Slow Down.* after 4 "
                             r"attempts; check that the bucket exists"):
        mirrors.push_mirrors(folder)  # an epoch's push: the step fails here
    assert order == ["weights.pth"] * mirrors.PUSH_ATTEMPTS and mirrors.PUSH_ATTEMPTS == 4
    order.clear()
    mirrors.push_mirrors()  # the store is back: nothing of the failed push was marked done
    assert order == ["weights.pth"] and "job/task/weights.pth" in _keys(s3, "ckpt")
    order.clear()
    monkeypatch.setenv("RANK", "1")  # another DDP process of the pod: rank 0 pushes
    _write(folder, "run.json", "changed")
    mirrors.push_mirrors()
    assert order == []
    # every process of the pod's job shares one local folder, filled once
    assert mirrors.Mirror("s3://ckpt/job/task").local == folder


@pytest.mark.parametrize("store, refusal", [
    ("no-such-bucket", r"\(FileNotFoundError: The specified bucket does not exist\) after 1 "
                       r"attempt; check that the bucket exists"),
    ("refusing-endpoint", r"\(EndpointConnectionError: Could not connect .*\) after 2 "
                          r"attempts")])
def test_kubeflow_a_checkpoint_root_the_store_refuses_fails_before_training(
        s3, mirrors, monkeypatch, tmp_path, store, refusal):
    """What a trainer asks first (its checkpoint folder) fails, naming the root and the
    store's error: at once where no retry mends it (a bucket that does not exist)."""
    import time

    import fsspec

    if store == "refusing-endpoint":
        monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")
        monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")  # botocore's own retries: seconds each
        fsspec.filesystem("s3").clear_instance_cache()
        monkeypatch.setattr(mirrors, "PUSH_ATTEMPTS", 2)
    started = time.monotonic()
    with pytest.raises(mirrors.CheckpointStoreError,
                       match=rf"s3://{store}/root/run-1/train failed {refusal}"):
        mirrors.run_folder("AIP_CHECKPOINT_DIR", str(tmp_path / "run-1" / "train" / "model"),
                           None, {"AIP_CHECKPOINT_DIR": f"s3://{store}/root"})
    assert mirrors._MIRRORS == {} and time.monotonic() - started < 10


_FINAL_PUSH = """
import os, sys
import boto3
from fsspec.asyn import sync
from components.common import storage
storage.PUSH_BACKOFF_S = 0.01
folder = storage.mirrored_folder("s3://ckpt/job/task")
(mirror,) = storage._MIRRORS.values()
put = mirror.fs.put

def put_on_a_new_connection(local, remote):  # the last one idled out in a long epoch:
    # aiohttp resolves the endpoint's name on its loop's thread pool, as here
    sync(mirror.fs.loop, mirror.fs.loop.getaddrinfo, "localhost", None)
    put(local, remote)

mirror.fs.put = put_on_a_new_connection
if sys.argv[1] == "lose-the-bucket":  # the store goes away while the step trains
    boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"]).delete_bucket(Bucket="ckpt")
if sys.argv[1] == "fork-a-child":  # a data loader's worker: it inherits the exit hook
    import multiprocessing

    def child():
        mirror.fs.put = None  # a push from here would fail, and exit 1
        open(os.path.join(folder, "child.txt"), "w").close()

    worker = multiprocessing.get_context("fork").Process(target=child)
    worker.start()
    worker.join()
    print("child exit code", worker.exitcode)
with open(os.path.join(folder, "events.out"), "w") as f:
    f.write("the last epoch's logs")  # written after the last save: the exit pushes it
"""


def test_kubeflow_a_failed_final_push_fails_the_process(s3, tmp_path):
    """The push at exit is the step's last: it opens connections as any push does (not
    after Python shut its thread pools down), and failed, the process exits non-zero (an
    exception raised at exit alone would leave it at 0)."""
    s3.create_bucket(Bucket="ckpt")
    env = {**os.environ, "TMPDIR": str(tmp_path)}

    def step(how):
        return subprocess.run([sys.executable, "-c", _FINAL_PUSH, how], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=120)

    kept = step("keep-the-bucket")
    assert kept.returncode == 0, kept.stderr[-3000:]
    assert _keys(s3, "ckpt") == ["job/task/events.out"]
    s3.delete_object(Bucket="ckpt", Key="job/task/events.out")
    forked = step("fork-a-child")  # only the process that made the mirror pushes
    assert forked.returncode == 0 and "child exit code 0" in forked.stdout, forked.stderr
    assert _keys(s3, "ckpt") == ["job/task/child.txt", "job/task/events.out"]
    for key in ("job/task/child.txt", "job/task/events.out"):
        s3.delete_object(Bucket="ckpt", Key=key)
    lost = step("lose-the-bucket")
    assert lost.returncode == 1
    assert "to s3://ckpt/job/task" in lost.stderr
    assert "The specified bucket does not exist" in lost.stderr


_LAUNCH = """
import json
from torch.distributed.launcher.api import elastic_launch
from components.common.storage import mirror_path
from components.train_transformer.launch import launch_config

if __name__ == "__main__":
    print(json.dumps(elastic_launch(launch_config(None, 2), mirror_path)("s3://ckpt/job/task")))
"""


def test_kubeflow_local_mirrors_are_shared_by_the_ranks_of_one_launch_only(tmp_path):
    """The DDP ranks torch's launcher starts (as the transformer step does, with its fixed
    run id) share a local mirror; two launches, or two lone processes (the Keras and fastai
    trainers), on one machine and naming the same remote, do not."""
    script = tmp_path / "launch.py"
    script.write_text(_LAUNCH)
    env = {**os.environ, "TMPDIR": str(tmp_path), "PYTHONPATH": REPO}
    lone = ["-c", "from components.common.storage import mirror_path; "
                  "print(mirror_path('s3://ckpt/job/task'))"]
    runs = [subprocess.Popen([sys.executable, *args], cwd=REPO, env=env, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            for args in ([str(script)], [str(script)], lone, lone)]
    outputs = []
    for run in runs:
        out, err = run.communicate(timeout=300)
        assert run.returncode == 0, err[-3000:]
        outputs.append(out.strip().splitlines()[-1])
    first, second = (json.loads(out) for out in outputs[:2])
    assert first["0"] == first["1"] and second["0"] == second["1"]  # one launch: shared
    folders = [first["0"], second["0"], *outputs[2:]]
    assert len(set(folders)) == 4  # everything else: its own
    assert all(f.startswith(os.path.join(str(tmp_path), "mirrors") + os.sep) for f in folders)


@pytest.mark.slow
def test_kubeflow_a_killed_training_pod_resumes_from_s3_on_retry(s3, mirrors, tmp_path,
                                                                 monkeypatch):
    """The text trainer killed after its first LM epoch (a pod lost), then retried in a new
    pod: the launcher's folders start empty, the checkpoints come back from S3."""
    import shutil

    from components.train_text.contract import TrainConfig
    from components.train_text.training import train_text_classifier
    from tests.test_text_train import FAST, TINY, Capture, StopAfter
    from tools.datamakers.demo_text import write_reviews_csv

    s3.create_bucket(Bucket="ckpt")
    monkeypatch.setenv("AIP_CHECKPOINT_DIR", "s3://ckpt/checkpoints")
    write_reviews_csv(str(tmp_path / "reviews.csv"), rows=60, seed=1)
    dataset = str(tmp_path / "dataset")
    prepare_text_dataset(str(tmp_path / "reviews.csv"), dataset, PrepareConfig())
    from components.train_text import schedule

    monkeypatch.setattr(schedule, "LM_ACCURACY_MARGIN", -1.0)
    monkeypatch.setattr(schedule, "MAX_RESTARTS", 0)
    config = TrainConfig(pretrained=False, lm_epochs=2, epochs=1, model_config=TINY, **FAST)
    model_dir = str(tmp_path / "run-7" / "train-text" / "model")  # the same on a retry
    first = Capture()
    with pytest.raises(KeyboardInterrupt):  # the pod dies after LM epoch 1
        train_text_classifier(dataset, model_dir, config,
                              callbacks=[first, StopAfter("LMLearner", 1)])
    assert "checkpoints/run-7/train-text/state.json" in _keys(s3, "ckpt")
    # the new pod: no launcher folder, no local mirror
    for mirror in mirrors._MIRRORS.values():
        shutil.rmtree(mirror.local)
    mirrors._MIRRORS.clear()
    shutil.rmtree(tmp_path / "run-7")
    second = Capture()
    result = train_text_classifier(dataset, model_dir, config, callbacks=[second])
    assert first.epochs == [("LMLearner", 0)]
    assert second.epochs[0] == ("LMLearner", 1)  # resumed: the second LM epoch only
    assert result["run"]["resumed_from"]["stage"] == "lm-all"


# A whole Kubeflow run of the image and transformer pipelines, on s3:// to a registered
# model: tests/test_kubeflow_rehearsal.py (the compiled YAML, rehearsed pod by pod).
