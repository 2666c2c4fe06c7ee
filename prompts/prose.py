"""English prose (`natural_language.txt`): text unlike the code the shipped tiny pair trained on."""

from pathlib import Path

NATURAL_LANGUAGE = Path(__file__).resolve().parent / "natural_language.txt"


def prose_lines() -> list[str]:
    """The file's non-empty lines, one prompt each."""
    return [line for line in NATURAL_LANGUAGE.read_text().splitlines() if line.strip()]
