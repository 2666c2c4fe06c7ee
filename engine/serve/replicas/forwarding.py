"""An HTTP request carried from the ingress to a replica, and answered there by the replica's own app.

The ingress reads the body and sends a `ForwardedRequest` through Ray Serve; the replica runs it through the
single server's FastAPI app in process (`answer`), so every status, error body and stream is the single
server's. The answer comes back as parts: the first carries the status, the headers and the first body bytes
together, so an ingress that has seen no part knows that no token reached the client (and may send the
request to another replica); the rest are body bytes. Closing the parts' iterator is a client's hang-up:
the app sees `http.disconnect` and aborts the request's samples.
"""

import asyncio
import json
from dataclasses import dataclass, field


@dataclass
class ForwardedRequest:
    method: str
    path: str
    query: bytes = b""
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    body: bytes = b""
    routing_text: str = ""  # what the prefix router matches: the prompt, or the chat's messages
    key: str = ""  # names the request to the ingress's routers (`routers.answering`)


@dataclass
class ResponseHead:
    status: int
    headers: list[tuple[bytes, bytes]]
    body: bytes  # the first body bytes (all of a plain response's)
    more: bool  # more body parts follow


def routing_text(path: str, body: bytes) -> str:
    """A completion's prompt (the first of a list), or a chat's messages as JSON; "" when the body is not
    one (the replica's app answers that with its error)."""
    try:
        request = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return ""
    if not isinstance(request, dict):
        return ""
    if path.endswith("/chat/completions"):
        return json.dumps(request.get("messages", ""), ensure_ascii=False)
    prompt = request.get("prompt", "")
    if isinstance(prompt, list) and prompt:
        prompt = prompt[0]
    return prompt if isinstance(prompt, str) else json.dumps(prompt)


async def answer(app, request: ForwardedRequest, client: tuple[str, int] = ("127.0.0.1", 0)):
    """Runs `request` through the ASGI `app`; yields its ResponseHead, then body bytes."""
    sent: asyncio.Queue = asyncio.Queue()
    hung_up = asyncio.Event()
    body_given = False

    async def receive():
        nonlocal body_given
        if not body_given:
            body_given = True
            return {"type": "http.request", "body": request.body, "more_body": False}
        await hung_up.wait()
        return {"type": "http.disconnect"}

    async def send(message):
        await sent.put(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": request.method,
             "scheme": "http", "path": request.path, "raw_path": request.path.encode(), "root_path": "",
             "query_string": request.query, "headers": request.headers, "client": client,
             "server": ("127.0.0.1", 0)}
    task = asyncio.create_task(app(scope, receive, send))
    task.add_done_callback(lambda t: sent.put_nowait(None))  # the app returned (or raised) without finishing
    try:
        start = await _next(sent, task)
        part = await _next(sent, task)
        yield ResponseHead(start["status"], start.get("headers", []), part.get("body", b""),
                           part.get("more_body", False))
        while part.get("more_body", False):
            part = await _next(sent, task)
            if part.get("body"):
                yield part["body"]
    finally:
        hung_up.set()
        if not task.done():
            try:
                await asyncio.wait_for(task, timeout=5)  # the app sees the disconnect and aborts its requests
            except (asyncio.TimeoutError, asyncio.CancelledError, Exception):
                task.cancel()


async def _next(sent: asyncio.Queue, task: asyncio.Task) -> dict:
    message = await sent.get()
    if message is None:
        if task.exception() is not None:
            raise task.exception()
        raise RuntimeError("the server's app ended its response early")
    return message
