"""Models: the offline tiny base model and loading of any policy checkpoint."""
