"""Text preparation step: load and validate a labelled CSV, split it train/validation/test."""
