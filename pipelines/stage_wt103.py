"""Stage fastai's pretrained English language model in a bucket, once, for jobs without internet.

    python -m pipelines.stage_wt103 --output gs://BUCKET/lm [--direction forward|backward|both]

The text pipeline with `lang=en`, `pretrained=true` and no `lm_assets` downloads fastai's
WikiText-103 AWD-LSTM. Where jobs cannot reach the internet, run this once where one can:
it fetches the same archives through fastai and writes them, as fastai extracted them,
to `<output>/en/<direction>/{config.json, vocab.pkl, weights.pth}`; then pass
`lm_assets=<output>`.
"""

from __future__ import annotations

import argparse
import sys

from components.common.commands import reports
from components.common.storage import filesystem
from components.train_text import assets
from components.train_text.contract import FASTAI_PRETRAINED_LANG, asset_uri, required_files

DIRECTIONS = {"forward": (False,), "backward": (True,), "both": (False, True)}
# fastai's default AWD-LSTM architecture, written out: config.json says what the weights are.
_ENCODER = ("emb_sz", "n_hid", "n_layers")


def stage(output: str, backwards: bool) -> list[str]:
    """Fetches one direction of fastai's English LM and writes it under `output`.

    Returns:
        The URIs written.

    Raises:
        MissingAssetsError: fastai could not fetch it (no internet here either).
    """
    import json

    from fastai.text.all import awd_lstm_lm_config

    fetched = assets.fetch_fastai_pretrained(backwards)
    fs, root = filesystem(output)
    config, vocab, weights = (asset_uri(root, rel) for rel in
                              required_files(FASTAI_PRETRAINED_LANG, backwards))
    fs.makedirs(config.rsplit("/", 1)[0], exist_ok=True)
    with fs.open(config, "w") as f:
        json.dump({"arch": "AWD_LSTM", **{k: awd_lstm_lm_config[k] for k in _ENCODER}}, f)
    fs.put(fetched.vocab, vocab)
    fs.put(fetched.weights, weights)
    return [asset_uri(output, rel) for rel in required_files(FASTAI_PRETRAINED_LANG, backwards)]


@reports(assets.MissingAssetsError)
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipelines.stage_wt103",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--output", required=True, help="assets root, gs:// or local")
    parser.add_argument("--direction", choices=sorted(DIRECTIONS), default="forward")
    args = parser.parse_args(argv)
    for backwards in DIRECTIONS[args.direction]:
        for uri in stage(args.output, backwards):
            print(uri)
    print(f"now run the text pipeline with lang=en, pretrained=true, lm_assets={args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
