"""Run a pipeline on this machine through `kfp.local`, on CPU, before paying for a GPU.

    python -m pipelines.run_local image --data <folder or gs://...> --output <dir> \
        [--<param> <value> ...]
    python -m pipelines.run_local text --data <csv or gs://...> --output <dir> \
        [--<param> <value> ...]
    python -m pipelines.run_local lm --data <corpus folder, .txt or .csv> --output <dir> \
        --lang <lang> [--epochs N ...]
    python -m pipelines.run_local transformer --data <csv or gs://...> --output <dir> \
        [--model-name <Hub name or model folder> --epochs N ...]
    python -m pipelines.run_local tune image|text|transformer --data ... --output <dir> \
        --trials N [--space <search space .json>] [--search-seed N] [--<param> <value> ...]

Each pipeline parameter is a flag (`image_size` -> `--image-size`). Steps run as
subprocesses of this Python; outputs land under `<output>/kfp/`, and `<output>/summary.json`
collects them. `tune` searches the Vertex tuning variant's space (or --space) with optuna,
one local run per trial under `<output>/trials/<n>/` (`pipelines.tune_local`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from components.common.baselines import no_better_than_constant
from pipelines.catalogue import BUILDERS, DATA_PARAMETERS
from pipelines.local_run import LOCAL_IMAGE, run
from pipelines.params import argparse_type
from pipelines.step_log import StepFailed

__all__ = ["LOCAL_IMAGE", "PIPELINES", "headline", "main", "pipeline_parser", "run"]

PIPELINES = BUILDERS


def pipeline_parser(kind: str, pipeline) -> argparse.ArgumentParser:
    """An argument parser whose flags are the pipeline's parameters."""
    parser = argparse.ArgumentParser(prog=f"python -m pipelines.run_local {kind}")
    parser.add_argument("--data", required=True, help="input folder or gs:// URI")
    parser.add_argument("--output", required=True, help="local folder for outputs and summary.json")
    for name, spec in pipeline.component_spec.inputs.items():
        if name == DATA_PARAMETERS[kind]:
            continue
        parser.add_argument(
            "--" + name.replace("_", "-"), dest=name, default=None,
            type=argparse_type(spec.type),
            help=f"{spec.description or ''} (default: {spec.default})",
        )
    return parser


def headline(kind: str, summary: dict[str, Any]) -> str:
    """One line with the test metrics of a run, then a warning for a model that learnt
    nothing (no better than the constant answer, or a unigram model)."""
    metrics = summary["metrics"]
    if kind == "lm":
        unigram = metrics.get("unigram") or {}
        floor = (f" (a unigram model of the training tokens: {unigram['perplexity']:.1f}, "
                 f"{unigram['accuracy']:.3f})" if unigram.get("perplexity") else "")
        line = (f"lm pipeline: held-out perplexity {metrics['perplexity']:.1f}, next-token "
                f"accuracy {metrics['accuracy']:.3f}{floor}; lm_assets: "
                f"{summary['artifacts']['lm_assets']}")
        nothing = metrics.get("learnt_nothing")
        return line + (f"\nwarning: the language model is no better than a unigram model; "
                       f"the text pipeline refuses these lm_assets ({nothing})" if nothing
                       else "")
    support = sum(v["support"] for v in metrics["per_label"].values())
    if "accuracy" in metrics:
        line = (f"{kind} pipeline: test accuracy {metrics['accuracy']:.3f}, macro F1 "
                f"{metrics['macro_f1']:.3f} over {support} examples")
        names = ("accuracy", "macro_f1")
    else:
        line = (f"{kind} pipeline: test micro F1 {metrics['micro_f1']:.3f}, macro F1 "
                f"{metrics['macro_f1']:.3f} ({support} label occurrences)")
        names = ("micro_f1", "macro_f1")
    beside = [f"{name} {values[names[0]]:.3f}/{values[names[1]]:.3f}"
              for name, values in summary.get("baseline", {}).items()]
    line += f"; baselines on the same split: {', '.join(beside)}" if beside else ""
    constant = no_better_than_constant(metrics[names[0]], summary.get("baseline", {}), names[0])
    if constant:
        line += f"\nwarning: the model is no better than the constant answer ({constant})"
    nothing = summary.get("training", {}).get("learnt_nothing")
    return line + (f"\nwarning: the classifier learnt nothing ({nothing})" if nothing else "")


def report_failure(failed: StepFailed) -> int:
    """Says which step failed and why, its log's path above and its own error last."""
    print(f"\nfull log of step {failed.task!r}: {failed.log_path}", file=sys.stderr)
    print(f"error: {failed}", file=sys.stderr)
    return 1


def tune_main(argv: list[str]) -> int:
    """`tune image|text|transformer ...`: the local hyperparameter search."""
    from components.tune.contract import TUNABLE, SearchSpaceError, read_space
    from pipelines import tune_local

    if not argv or argv[0] not in TUNABLE:
        print(f"usage: python -m pipelines.run_local tune {{{','.join(TUNABLE)}}} --data ... "
              "--output DIR --trials N [--space FILE] [--search-seed N] [--<param> <value> ...]",
              file=sys.stderr)
        return 2
    kind = argv[0]
    parser = pipeline_parser(kind, PIPELINES[kind](LOCAL_IMAGE))
    parser.prog = f"python -m pipelines.run_local tune {kind}"
    parser.add_argument("--trials", type=int, required=True, help="number of trials")
    parser.add_argument("--space", default=None,
                        help="search space JSON file (default: the Vertex variant's default)")
    parser.add_argument("--search-seed", dest="search_seed", type=int, default=0,
                        help="seed of the search's sampler (default 0)")
    args = vars(parser.parse_args(argv[1:]))
    data, output = args.pop("data"), args.pop("output")
    trials, space_file, search_seed = args.pop("trials"), args.pop("space"), args.pop(
        "search_seed")
    if trials < 1:
        parser.error(f"--trials must be >= 1, got {trials}")
    try:
        space = read_space(kind, space_file)
    except (SearchSpaceError, OSError) as err:
        parser.error(str(err))
    params = {k: v for k, v in args.items() if v is not None}
    try:
        summary = tune_local.tune(kind, data, output, space, trials, params, seed=search_seed)
    except StepFailed as failed:
        return report_failure(failed)
    print(json.dumps({k: summary[k] for k in ("trials", "best")}, indent=2))
    print(f"\nsummary: {os.path.join(os.path.abspath(output), 'summary.json')}")
    best = summary["best"]
    print(f"best of {trials} trials: #{best['number']} {space.metric} {best['metric']:.4f} "
          f"with {json.dumps(best['parameters'], sort_keys=True)}")
    print(headline(kind, summary))
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "tune":
        return tune_main(argv[1:])
    if not argv or argv[0] not in PIPELINES:
        print(__doc__.strip(), file=sys.stderr)
        from components.tune.contract import TUNABLE

        print(f"\npipelines: {', '.join(PIPELINES)}; tune: {', '.join(TUNABLE)}",
              file=sys.stderr)
        return 2
    kind = argv[0]
    args = vars(pipeline_parser(kind, PIPELINES[kind](LOCAL_IMAGE)).parse_args(argv[1:]))
    data, output = args.pop("data"), args.pop("output")
    params = {k: v for k, v in args.items() if v is not None}
    try:
        summary = run(kind, data, output, params)
    except StepFailed as failed:
        return report_failure(failed)
    print(f"\nsummary: {os.path.join(os.path.abspath(output), 'summary.json')}")
    print(headline(kind, summary))
    if "report_html" in summary["artifacts"]:
        print(f"report: {summary['artifacts']['report_html']} (open it in a browser)")
    if "predictions" in summary:
        counts = summary["predictions"]
        print(f"predictions: {counts['predicted']} of {counts['inputs']} inputs labelled, "
              f"{counts['errors']} unreadable; {summary['artifacts']['predictions']}")
        for line in counts["first"]:
            print(f"  {line['input']}: " + (f"error: {line['error']}" if "error" in line else
                  ", ".join(f"{label} {line['scores'][label]:.3f}" for label in line["labels"])
                  or "no label"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
