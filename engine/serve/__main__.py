"""`python -m engine.serve`: the OpenAI-compatible server (its command line lives in `containers.serve_cli`)."""

from containers.serve_cli import main

if __name__ == "__main__":
    main()
