"""EAGLE speculative decoding: draft -> verify -> commit -> draft-extend."""
