"""`eyas-serve replicas=ray`: the server as Ray Serve replicas behind one ingress, until interrupted.

With `replicas.address` null it starts a local Ray cluster on this machine (127.0.0.1) and stops it at
the end; with an address it joins that cluster (`ray start --head` on the head node, `ray start
--address=HEAD:6379` on the others) and removes only its own application.
"""

import os
import signal
import threading

from rich.console import Console

from eyas.containers.build import container_of
from eyas.containers.replicas import ReplicasContainer
from eyas.engine.errors import ConfigError, EyasError


def serve_replicas(config: dict, console: Console) -> None:
    """Serve a resolved config (`prepare`d, notices shown) on Ray Serve until SIGINT / SIGTERM."""
    replicas, server = config["replicas"], config["server"]
    local = replicas["address"] is None
    cpus = os.cpu_count() or 1
    if local:
        needed = replicas["num_replicas"] * replicas["cpus_per_replica"]
        if needed > cpus:
            raise ConfigError(f"replicas.num_replicas ({replicas['num_replicas']}) x replicas.cpus_per_replica "
                              f"({replicas['cpus_per_replica']}) = {needed} CPUs, but this machine has {cpus}: "
                              f"lower one of them (cpus_per_replica may be fractional, e.g. 0.5)")
        # read when Ray is imported: a one-node cluster, all of Ray's own traffic on 127.0.0.1 as well, and
        # no auth token written under $HOME
        os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    try:
        import ray
        from ray import serve
    except ImportError as e:
        raise ConfigError(f"replicas.launcher=ray needs Ray Serve: pip install 'eyas[ray]' ({e})") from None

    if local:
        ray.init(num_cpus=cpus, include_dashboard=False, namespace="eyas", log_to_driver=False)
    else:
        ray.init(address=replicas["address"], namespace="eyas", log_to_driver=False)
    container = container_of(config, ReplicasContainer)
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    try:
        serve.start(http_options={"host": server["host"], "port": server["port"]})
        console.print(f"eyas: starting {replicas['num_replicas']} replicas on Ray "
                      f"({'local cluster' if local else replicas['address']}), routing {replicas['routing']}",
                      markup=False, highlight=False, soft_wrap=True)
        serve.run(container.application(), name=container.app_name(), route_prefix="/", blocking=False)
        console.print(f"eyas: serving on http://{server['host']}:{server['port']}/v1 ({replicas['num_replicas']} "
                      f"replicas)", markup=False, highlight=False, soft_wrap=True)
        while not stop.wait(0.5):
            pass
    except RuntimeError as e:  # Ray Serve: the application did not deploy (a replica failed to start)
        raise EyasError(f"the replicas did not start: {e}") from None
    finally:
        if local:  # the cluster this process started goes with it, replicas and all
            ray.shutdown()
        else:  # a cluster others may use: only this application and its metrics board
            try:
                serve.delete(container.app_name())
                ray.kill(ray.get_actor(container.board_name(), namespace="eyas"))
            except Exception:  # noqa: BLE001 - shutting down what is left
                pass
