"""Goodput's training-side client: flash checkpoints for PyTorch state."""
