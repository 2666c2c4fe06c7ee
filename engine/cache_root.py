"""Where eyas keeps what it builds or measures once per machine: `$EYAS_CACHE_DIR`, else
`$XDG_CACHE_HOME/eyas`, else `~/.cache/eyas` (weight layouts' record, the C++ CPU ops' builds)."""

import os
from pathlib import Path


def cache_root() -> Path:
    root = os.environ.get("EYAS_CACHE_DIR") or Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache") / "eyas"
    return Path(root).expanduser()
