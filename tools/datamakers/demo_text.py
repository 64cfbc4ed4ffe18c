"""A small synthetic review CSV made on the spot, so the text pipeline runs with nothing downloaded.

    python -m tools.datamakers.demo_text OUT.csv [--rows 200] [--seed 0]

French reviews (the pipeline's default language) with four one-hot labels (prix,
livraison, qualite, service); each label has its own words, so even a tiny model
learns them. About one row in ten has no label (the pipeline gives it "other"),
and about a third have two.
"""

from __future__ import annotations

import argparse
import csv
import os
import sys

import numpy as np

LABEL_WORDS = {
    "prix": ["prix", "cher", "coûteux", "abordable", "tarif", "promotion", "euros"],
    "livraison": ["livraison", "colis", "livreur", "retard", "expédition", "délai",
                  "transporteur"],
    "qualite": ["qualité", "solide", "fragile", "cassé", "matériau", "finition", "robuste"],
    "service": ["service", "vendeur", "accueil", "réponse", "aimable", "conseil", "remboursement"],
}
FILLER = ["le", "la", "un", "très", "vraiment", "produit", "article", "je", "suis", "et",
          "mais", "pas", "assez", "bien", "ce", "commande", "plutôt", "content", "déçu", "avec"]


def review(labels: list[str], rng: np.random.Generator) -> str:
    """One review mentioning each of `labels` with two or three of its words."""
    words = list(rng.choice(FILLER, size=int(rng.integers(4, 8))))
    for label in labels:
        words += list(rng.choice(LABEL_WORDS[label], size=int(rng.integers(2, 4)), replace=False))
    rng.shuffle(words)
    return " ".join(words).capitalize() + "."


def write_reviews_csv(path: str, rows: int = 200, seed: int = 0) -> dict[str, int]:
    """Writes `rows` reviews as a multi-label CSV (`text`, one 0/1 column per label), the
    same for the same `seed`; the rows carrying each label, and `none` for no label."""
    rng = np.random.default_rng(seed)
    names = list(LABEL_WORDS)
    counts = {name: 0 for name in names} | {"none": 0}
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["text", *names])
        for _ in range(rows):
            k = int(rng.choice([0, 1, 2], p=[0.1, 0.55, 0.35]))
            chosen = sorted(rng.choice(names, size=k, replace=False).tolist())
            for name in chosen:
                counts[name] += 1
            counts["none"] += not chosen
            writer.writerow([review(chosen, rng), *(int(n in chosen) for n in names)])
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.datamakers.demo_text", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("path", help="CSV file to write")
    parser.add_argument("--rows", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    counts = write_reviews_csv(args.path, rows=args.rows, seed=args.seed)
    print(f"wrote {args.rows} reviews to {args.path}: {counts}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
