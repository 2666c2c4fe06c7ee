"""`python -m eyas key=value ...`: the Hydra command line (it lives in `eyas.launch.cli`)."""

from eyas.launch.cli import main

if __name__ == "__main__":
    main()
