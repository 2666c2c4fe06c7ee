"""The checkout the tests read: its root, and the folders whose Python modules the package installs."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CODE_FOLDERS = ("engine", "containers", "launch", "kernels", "bench", "prompts", "testing")
