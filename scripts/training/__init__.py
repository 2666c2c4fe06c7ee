"""Helpers shared by the training scripts."""
