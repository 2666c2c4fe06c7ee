"""The HTTP app: the FastAPI app with its error handler and API key check, and the routes registered.

The endpoints live in `routes.py`, request checks in `request_parsing.py`, response bodies in
`openai_format.py` and the reading of a request's samples (whole or streamed) in `streaming.py`. A
request refused anywhere on the way is answered here with its status and an OpenAI-style error body.
"""

import hmac
from typing import Callable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from eyas.engine.chat_template import ChatTemplate
from eyas.engine.sampling_params import SamplingParams
from eyas.engine.serve.loop import EngineLoop
from eyas.engine.serve.metrics import ServerMetrics
from eyas.engine.serve.protocol import RequestValidationError, error_body
from eyas.engine.serve.request_parsing import RequestParser
from eyas.engine.serve.routes import OpenAIRoutes
from eyas.engine.tokenizer import Tokenizer


def create_app(loop: EngineLoop, metrics: ServerMetrics, tokenizer: Tokenizer, model_name: str, vocab_size: int,
               context_len: int, defaults: SamplingParams, chat_template: ChatTemplate,
               api_key: str | None = None, max_body_bytes: int = 8 << 20) -> FastAPI:
    app = FastAPI(title="eyas", docs_url=None, redoc_url=None)
    app.state.loop, app.state.model_name = loop, model_name

    @app.exception_handler(RequestValidationError)
    async def refused(_, e: RequestValidationError):
        metrics.refused.labels(str(e.status)).inc()
        err_type = "invalid_request_error" if e.status < 500 else "server_error"
        if e.status == 401:
            err_type = "authentication_error"
        return JSONResponse(error_body(e.message, e.param, err_type, e.code), status_code=e.status)

    parser = RequestParser(tokenizer, model_name, vocab_size, context_len, defaults, max_body_bytes)
    routes = OpenAIRoutes(loop, metrics, tokenizer, parser, chat_template, authorize=api_key_check(api_key))
    app.get("/health")(routes.health)
    app.get("/metrics")(routes.prometheus)
    app.get("/v1/models")(routes.models)
    app.post("/v1/completions")(routes.completions)
    app.post("/v1/chat/completions")(routes.chat_completions)
    return app


def api_key_check(api_key: str | None) -> Callable[[Request], None]:
    """Refuses (401) a request without `Authorization: Bearer <api_key>`; with no key, none. A check each
    /v1 handler makes, not an HTTP middleware: those hide a client's disconnect from the handler."""

    def authorize(request: Request) -> None:
        given = request.headers.get("authorization", "").encode()
        if api_key and not hmac.compare_digest(given, f"Bearer {api_key}".encode()):  # in constant time
            raise RequestValidationError("missing or wrong API key (Authorization: Bearer ...)", None, status=401,
                                         code="invalid_api_key")

    return authorize
