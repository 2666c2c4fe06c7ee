"""The replicated server (`replicas=ray`): Ray Serve deployments of the server, bound from the config.

`application()` is the Ray Serve application: `replicas.num_replicas` `EyasReplica`s, each building its
own server container in its own process (`replica_objects`), behind one `EyasIngress` whose handle routes by
`replicas.routing`.
"""

import dataclasses
import math
from functools import partial

from dependency_injector import containers, providers

from eyas.containers.server_container import ServerContainer
from eyas.engine.config.schema import Config


def replica_objects(config: Config):
    """(app, loop, metrics) of one replica's server; torch threads `cpus_per_replica` unless num_threads says."""
    if config.num_threads is None:
        config = dataclasses.replace(config, num_threads=max(1, math.floor(config.replicas.cpus_per_replica)))
    container = ServerContainer()
    container.config.override(providers.Object(config))
    return container.app(), container.loop(), container.metrics()


def board_name(app_name: str) -> str:
    return f"eyas-metrics-{app_name}"


def replicated_application(config: Config, app_name: str):
    from ray.serve.config import RequestRouterConfig  # the [ray] extra

    from eyas.engine.serve.replicas.deployments import EyasIngress, EyasReplica, IngressSettings
    from eyas.engine.serve.replicas.ray_router import EyasRequestRouter

    replicas, server = config.replicas, config.server
    router = RequestRouterConfig(request_router_class=EyasRequestRouter,
                                 request_router_kwargs={"routing": str(replicas.routing),
                                                        **dataclasses.asdict(replicas.prefix)})
    replica = EyasReplica.options(
        name="EyasReplica", num_replicas=replicas.num_replicas, max_ongoing_requests=replicas.max_ongoing_requests,
        ray_actor_options={"num_cpus": replicas.cpus_per_replica}, request_router_config=router,
        health_check_period_s=2, health_check_timeout_s=30, graceful_shutdown_timeout_s=5,
    ).bind(partial(replica_objects, config), board_name(app_name))
    settings = IngressSettings(replicas.retries, replicas.first_part_timeout_s, server.max_body_bytes,
                               board_name(app_name))
    # the ingress holds no CPU: it waits on the replicas; its own requests cap is far above theirs together
    return EyasIngress.options(name="EyasIngress", num_replicas=1, ray_actor_options={"num_cpus": 0},
                               max_ongoing_requests=100_000).bind(replica, settings)


class ReplicasContainer(containers.DeclarativeContainer):
    config = providers.Dependency(instance_of=Config)  # with its `server` and `replicas` groups
    app_name = providers.Object("eyas")
    application = providers.Singleton(replicated_application, config, app_name)
    board_name = providers.Callable(board_name, app_name)
