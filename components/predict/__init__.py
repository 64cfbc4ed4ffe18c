"""Batch prediction step: a trained model labels a folder of images or a CSV of texts."""
