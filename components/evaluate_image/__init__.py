"""Image evaluation step: a trained image classifier scored on one split of the shards."""
