"""A small BERT from scratch on a CSV's texts: a `--model-name` folder with no Hub access.

    python -m tools.datamakers.tiny_transformer --data CSV --output DIR [--text-column text]

Counts a WordPiece vocabulary on the CSV's text column and saves it with a randomly
initialised 2-layer BERT (hidden 128) as `save_pretrained` writes a Hub model. The
transformer pipeline takes the folder as its model name:

    python -m pipelines.run_local transformer --data CSV --output RUN --model-name DIR \\
        --learning-rate 1e-3 --batch-size 8 --epochs 15 --max-length 96 \\
        --early-stopping-patience 3

It has learnt nothing before fine-tuning: it shows the pipeline working, not what a
pretrained encoder scores (it needs the rate and small batches above).
"""

from __future__ import annotations

import argparse
import sys

from components.common.storage import filesystem


def main(argv: list[str] | None = None) -> int:
    import pandas as pd

    from components.train_transformer.tiny import write_tiny_model

    parser = argparse.ArgumentParser(prog="python -m tools.datamakers.tiny_transformer",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True, help="CSV (gs:// or local) with the texts")
    parser.add_argument("--output", required=True, help="model folder to write")
    parser.add_argument("--text-column", default="text", help="column holding the texts")
    parser.add_argument("--vocab-size", type=int, default=4000, help="largest vocabulary")
    parser.add_argument("--hidden-size", type=int, default=128, help="encoder width")
    parser.add_argument("--layers", type=int, default=2, help="transformer layers")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    args = parser.parse_args(argv)
    fs, path = filesystem(args.data)
    with fs.open(path, "rb") as f:
        frame = pd.read_csv(f, dtype=str, keep_default_na=False)
    if args.text_column not in frame.columns:
        parser.error(f"{args.data!r} has no column {args.text_column!r} (its columns: "
                     f"{list(frame.columns)}); pass --text-column")
    texts = [t for t in frame[args.text_column] if t.strip()]  # the non-empty ones
    try:
        made = write_tiny_model(texts, args.output, vocab_size=args.vocab_size,
                                hidden_size=args.hidden_size, layers=args.layers,
                                seed=args.seed)
    except ValueError as err:
        parser.exit(2, f"error: {err}\n")
    print(f"wrote a {made['parameters']:,}-parameter BERT (vocabulary {made['vocab_size']}, "
          f"counted on {len(texts)} texts) to {args.output}; pass it as --model-name")
    return 0


if __name__ == "__main__":
    sys.exit(main())
