"""Drafters: what proposes the draft tree that the target verifies (EAGLE heads, n-gram lookup, a
standalone draft LM, and the hybrid of a head and the lookup), behind one `Drafter` protocol."""
