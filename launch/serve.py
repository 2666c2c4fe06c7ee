"""`eyas-serve key=value ...` (and `python -m eyas.launch.serve`): the server's Hydra command line.

It composes `conf/serve.yaml` (the engine's tree plus the `server` group), so every engine override
works here too, builds the server container, and runs uvicorn until interrupted.
"""

import signal
import sys
import threading

import hydra
from omegaconf import DictConfig
from rich.console import Console

from eyas.containers.build import container_of
from eyas.containers.server_container import ServerContainer
from eyas.engine.config import prepare
from eyas.engine.errors import EyasError
from eyas.launch.compose import config_dir, register_resolvers, to_plain
from eyas.launch.schema import register_schemas
from eyas.launch.serve_replicas import serve_replicas


def serve(config: dict, console: Console | None = None) -> None:
    """Serve a composed config (resolved here; its notices printed) until interrupted."""
    import uvicorn  # the [serve] extra

    console = console or Console(stderr=True)
    config, notices = prepare(config)
    for notice in notices:
        console.print(notice, markup=False, highlight=False, soft_wrap=True)
    if (config.get("replicas") or {}).get("launcher", "none") != "none":
        return serve_replicas(config, console)
    container = container_of(config, ServerContainer)
    app, loop = container.app(), container.loop()
    settings = config["server"]
    http = uvicorn.Server(uvicorn.Config(app, host=settings["host"], port=settings["port"],
                                         log_level=settings["log_level"]))
    # HTTP on a thread of its own; the engine loop on this one, which built the engine (see eyas.engine.serve.loop)
    http_thread = threading.Thread(target=http.run, name="eyas-http", daemon=True)

    def shut_down(*_):
        http.should_exit = True
        loop.stop()

    signal.signal(signal.SIGINT, shut_down)
    signal.signal(signal.SIGTERM, shut_down)
    http_thread.start()
    while not http.started:
        if not http_thread.is_alive():  # e.g. the port is taken: uvicorn said why
            raise EyasError(f"the HTTP server did not start on {settings['host']}:{settings['port']}")
        http_thread.join(timeout=0.05)
    console.print(f"eyas: serving {app.state.model_name!r} on http://{settings['host']}:{settings['port']}/v1",
                  markup=False, highlight=False, soft_wrap=True)
    try:
        loop.run()
    finally:
        http.should_exit = True
        http_thread.join(timeout=30)


register_schemas()
register_resolvers()


@hydra.main(config_path=config_dir(), config_name="serve", version_base="1.3")
def hydra_main(cfg: DictConfig) -> None:
    try:
        serve(to_plain(cfg))
    except EyasError as e:
        Console(stderr=True).print(f"error: {e}", markup=False, highlight=False)
        sys.exit(2)


def main() -> None:
    hydra_main()


if __name__ == "__main__":
    main()
