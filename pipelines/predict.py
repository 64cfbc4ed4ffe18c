"""Label new data with a trained model, on this machine.

    python -m pipelines.predict --model <model folder> --data <input> --output <file.jsonl>

The model folder is a training step's output (local or gs://); the input a folder of
images (any depth) for an image model, or a CSV with the text column for a text model.
One JSON line per input, in input order: `{"input", "labels", "scores"}`, or `{"input",
"error"}` for an input that cannot be read.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile

from components.common.commands import reports
from components.common.input_kinds import InputKindError
from components.predict.contract import PredictionError


@reports(PredictionError, InputKindError, FileNotFoundError)
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="trained model folder (local or gs://)")
    parser.add_argument("--data", required=True,
                        help="folder of images / CSV of texts (local or gs://)")
    parser.add_argument("--output", required=True, help="JSON lines file to write (local or gs://)")
    parser.add_argument("--batch-size", type=int, default=64, help="inputs per forward pass")
    parser.add_argument("--text-column", default="",
                        help="text models: the CSV's text column (default: the training one)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)

    from components.predict.prediction import copy_model_locally, predict_to_file, same_file

    if same_file(args.data, args.output):  # before anything is read or written
        print(f"error: --output {args.output!r} is the same file as --data {args.data!r}: "
              "the predictions would replace the input; give --output another file",
              file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as workdir:
        model_dir = copy_model_locally(args.model, workdir)
        counts = predict_to_file(model_dir, args.data, args.output, args.batch_size,
                                 progress=not args.no_progress, text_column=args.text_column,
                                 model_uri=args.model)
    print(json.dumps(counts, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
