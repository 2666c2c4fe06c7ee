"""The Ray Serve deployments: `EyasReplica` (an engine and the single server's app, N of them) and
`EyasIngress` (one FastAPI app in front: the same API, streaming, errors and `/metrics`).

The ingress reads a request's body, sends it to a replica through the replica deployment's handle (Ray
Serve's router with eyas's routing policy, `ray_router`) and streams the replica's answer back. A replica
that dies before the first part of its answer has reached the ingress (for a stream, before its first
token) gets the request sent to another one, at most `retries` times; one that dies later ends the response
with an error (an SSE error event on a stream). Ray Serve restarts dead replicas.

How they are built (from the config) is `eyas.containers.replicas`.
"""

import asyncio
import json
import os
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Callable

import ray
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from ray import serve
from ray.exceptions import ActorUnavailableError, RayActorError
from ray.serve.handle import DeploymentHandle

from eyas.engine.serve.protocol import RequestValidationError, error_body
from eyas.engine.serve.replicas import router_metrics, routers
from eyas.engine.serve.replicas.forwarding import ForwardedRequest, ResponseHead, answer, routing_text
from eyas.engine.serve.replicas.metrics_board import MetricsBoard, merge_expositions
from eyas.engine.serve.request_parsing import read_body

REPLICA_GONE = (RayActorError, ActorUnavailableError)  # the replica's process died or cannot be reached
BOARD_POST_S = 2.0
NAMESPACE = "eyas"


@dataclass
class IngressSettings:
    retries: int  # sends of a request to another replica when its replica dies before answering
    first_part_timeout_s: float  # a request whose replica has not started answering by then gets 504
    max_body_bytes: int
    board: str  # the metrics board actor's name


def metrics_board(name: str):
    """The named board actor, created by whoever asks first."""
    return ray.remote(MetricsBoard).options(name=name, namespace=NAMESPACE, get_if_exists=True, num_cpus=0,
                                            lifetime="detached").remote()


@serve.deployment
class EyasReplica:
    """One engine and the server's app. `build()` runs on the replica's engine thread and returns (app, loop,
    metrics); that thread then runs the engine loop (it built the engine: see `eyas.engine.serve.loop`)."""

    def __init__(self, build: Callable, board: str):
        self.replica_id = serve.get_replica_context().replica_id.unique_id
        built, failure = threading.Event(), []

        def engine_thread():
            try:
                self.app, self.loop, self.metrics = build()
            except BaseException as e:  # noqa: BLE001 - handed to the constructor, which raises it
                failure.append(e)
                return
            finally:
                built.set()
            self.loop.run()

        self.engine_thread = threading.Thread(target=engine_thread, name="eyas-engine-loop", daemon=True)
        self.engine_thread.start()
        built.wait()
        if failure:
            raise failure[0]
        self.board = metrics_board(board)
        threading.Thread(target=self.post_metrics, name="eyas-metrics-post", daemon=True).start()

    def post_metrics(self) -> None:
        info = {"pid": os.getpid(), "node": ray.get_runtime_context().get_node_id()}
        while self.engine_thread.is_alive():
            self.board.post.remote(self.replica_id, self.metrics.exposition().decode(), info)
            time.sleep(BOARD_POST_S)

    async def forward(self, request: ForwardedRequest):
        replica = (b"x-eyas-replica", self.replica_id.encode())
        async for part in answer(self.app, request):
            if isinstance(part, ResponseHead):
                part.headers = [*part.headers, replica]
            yield part

    def check_health(self) -> None:  # Ray Serve calls it; raising marks the replica unhealthy (restarted)
        if not self.engine_thread.is_alive():
            raise RuntimeError("the engine loop stopped")


class ClientGone(Exception):
    """The client hung up before its answer started."""


def error_response(message: str, status: int, code: str | None) -> JSONResponse:
    err_type = "invalid_request_error" if status < 500 else "server_error"
    return JSONResponse(error_body(message, None, err_type, code), status_code=status)


# the app is serialised when `serve.ingress` decorates the class: what its routes call is defined above
ingress_app = FastAPI(title="eyas", docs_url=None, redoc_url=None)


@serve.deployment
@serve.ingress(ingress_app)
class EyasIngress:
    def __init__(self, replicas: DeploymentHandle, settings: IngressSettings):
        self.replicas = replicas.options(method_name="forward", stream=True)
        self.settings = settings
        self.board = metrics_board(settings.board)

    @ingress_app.get("/health")
    async def health(self):
        live = len(await self.board.read.remote())
        if live:
            return {"status": "ok", "replicas": live}
        return JSONResponse({"status": "no replica is serving", "replicas": 0}, status_code=503)

    @ingress_app.get("/metrics")
    async def prometheus(self):
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        posts = await self.board.read.remote()
        replicas = merge_expositions({replica: text for replica, (text, _) in posts.items()})
        info = ["# HELP eyas_replica_info A replica serving now (its process id and Ray node)",
                "# TYPE eyas_replica_info gauge"]
        info += [f'eyas_replica_info{{replica="{r}",pid="{i["pid"]}",node="{i["node"]}"}} 1' for r, (_, i) in
                 sorted(posts.items())]
        info += ["# HELP eyas_replicas_live Replicas that posted their metrics lately",
                 "# TYPE eyas_replicas_live gauge", f"eyas_replicas_live {len(posts)}"]
        text = generate_latest(router_metrics.REGISTRY).decode() + "\n".join(info) + "\n" + replicas
        return Response(text, media_type=CONTENT_TYPE_LATEST)

    @ingress_app.api_route("/v1/{path:path}", methods=["GET", "POST"])
    async def v1(self, request: Request, path: str):
        try:
            body = await read_body(request, self.settings.max_body_bytes)
        except RequestValidationError as e:
            return error_response(e.message, e.status, e.code)
        forwarded = ForwardedRequest(request.method, request.url.path, request.url.query.encode(),
                                     list(request.scope["headers"]), body,
                                     routing_text(request.url.path, body) if request.method == "POST" else "",
                                     uuid.uuid4().hex)
        for attempt in range(self.settings.retries + 1):
            parts = self.replicas.remote(forwarded)
            try:
                head = await self.first_part(parts, request)
                routers.answering(forwarded.key)
                break
            except REPLICA_GONE as e:
                parts.cancel()
                if attempt < self.settings.retries:
                    router_metrics.RETRIED.inc()
                    continue
                router_metrics.FAILED.labels("replica_died").inc()
                return error_response(f"the replica serving this request died before answering "
                                      f"({type(e).__name__}), {attempt + 1} times; retry later", 503,
                                      "replica_unavailable")
            except asyncio.TimeoutError:
                parts.cancel()
                router_metrics.FAILED.labels("timeout").inc()
                return error_response(f"no replica started answering within replicas.first_part_timeout_s = "
                                      f"{self.settings.first_part_timeout_s} s", 504, "replica_timeout")
            except ClientGone:
                parts.cancel()
                return Response(status_code=499)
            except BaseException:
                parts.cancel()
                raise
        headers = {k.decode(): v.decode() for k, v in head.headers if k.lower() not in (b"content-length",)}
        if not head.more:
            return Response(head.body, status_code=head.status, headers=headers)
        return StreamingResponse(self.rest(head, parts), status_code=head.status, headers=headers)

    async def first_part(self, parts, request: Request) -> ResponseHead:
        """The replica's first part; polls for the client's hang-up meanwhile (a plain response's first part
        is all of it, and the handler is not cancelled when its client goes)."""
        pending = asyncio.ensure_future(parts.__anext__())
        deadline = time.monotonic() + self.settings.first_part_timeout_s
        try:
            while True:
                done, _ = await asyncio.wait({pending}, timeout=0.2)
                if done:
                    return pending.result()
                if await request.is_disconnected():
                    raise ClientGone()
                if time.monotonic() > deadline:
                    raise asyncio.TimeoutError()
        finally:
            if not pending.done():
                pending.cancel()

    async def rest(self, head: ResponseHead, parts):
        finished = False
        try:
            yield head.body
            async for chunk in parts:
                yield chunk
            finished = True
        except REPLICA_GONE as e:
            router_metrics.FAILED.labels("replica_died_while_answering").inc()
            message = f"the replica serving this request died while answering ({type(e).__name__})"
            yield f"data: {json.dumps(error_body(message, None, 'server_error', 'replica_died'))}\n\n".encode()
        finally:
            if not finished:
                parts.cancel()
