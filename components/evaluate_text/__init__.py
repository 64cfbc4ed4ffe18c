"""Text evaluation step: a trained text classifier scored on one split of the prepared CSV."""
