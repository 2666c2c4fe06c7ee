"""`python -m engine`: the Hydra command line (it lives in `launch.cli`)."""

from launch.cli import main

if __name__ == "__main__":
    main()
