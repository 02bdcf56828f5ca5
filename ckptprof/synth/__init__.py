"""Synthetic mode: realistic checkpoints on a target storage, and the restore runner."""
