"""`python -m engine.serve`: the OpenAI-compatible server (its command line lives in `launch.serve_cli`)."""

from launch.serve_cli import main

if __name__ == "__main__":
    main()
