"""The request routers of this process (the ingress's), so that the ingress can tell them when a request's
answer starts: Ray Serve reports only routing and completion.

A module of its own because Ray Serve ships the router's class by value: globals of its module are copies in
the ingress's process, a module it imports is the one the ingress imports.
"""

import weakref

ROUTERS = weakref.WeakSet()


def register(router) -> None:
    ROUTERS.add(router)


def answering(key: str) -> None:
    """The request forwarded with `key` started answering (the ingress has its first part)."""
    for router in list(ROUTERS):
        router.answering(key)
