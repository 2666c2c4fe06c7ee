"""`python -m engine`: the Hydra command line (composition lives in `containers.cli`)."""

from containers.cli import main

if __name__ == "__main__":
    main()
