"""A submitted request's samples read off their shared event queue: every final output at once for a
plain response (`final_outputs`), or the text as it comes for a stream (`sse_response`).

Streams are server-sent events ending with `data: [DONE]`; a sample's logprobs go out with the chunk
that carries the last of their text. A client that goes away (streaming or not) has every sample of
its request aborted and their KV freed.
"""

import asyncio
import time

from fastapi import Request
from fastapi.responses import StreamingResponse

from eyas.engine.outputs import RequestOutput
from eyas.engine.serve.detokenizer import IncrementalDetokenizer
from eyas.engine.serve.loop import EngineLoop, Finished, Stream
from eyas.engine.serve.openai_format import sse_data, text_logprobs
from eyas.engine.serve.protocol import RequestValidationError, error_body
from eyas.engine.tokenizer import Tokenizer

DISCONNECT_POLL_S = 0.2
SSE_DONE = "data: [DONE]\n\n"


def abort_all(loop: EngineLoop, streams: list[Stream]) -> None:
    for stream in streams:
        loop.abort(stream)


async def final_outputs(request: Request, loop: EngineLoop, streams: list[Stream]) -> list[RequestOutput]:
    """Every sample's output, in index order (the choice index), once all have finished."""
    events, outputs = streams[0].events, {}
    checked = time.monotonic()
    while len(outputs) < len(streams):
        try:
            index, event = await asyncio.wait_for(events.get(), DISCONNECT_POLL_S)
        except asyncio.TimeoutError:
            index, event = None, None
        if isinstance(event, Finished):
            if event.output.finish_reason == "error":
                abort_all(loop, streams)
                raise RequestValidationError(event.output.error, None, status=500)
            outputs[index] = event.output
        if time.monotonic() - checked >= DISCONNECT_POLL_S:  # tokens arrive every step: check by the clock
            checked = time.monotonic()
            if await request.is_disconnected():
                abort_all(loop, streams)
                raise RequestValidationError("client closed the request", None, status=499)
    return [outputs[i] for i in range(len(streams))]


def sse_response(loop: EngineLoop, tokenizer: Tokenizer, streams: list[Stream], chunk, last,
                 first) -> StreamingResponse:
    """chunk(index, text, finish_reason, logprob entries, text offset) -> a chunk body; last(outputs) ->
    the bodies after every sample finished (None: none); first: bodies sent before the first token's."""
    stops = streams[0].params.stop
    detokenizers = [IncrementalDetokenizer(tokenizer, stops) for _ in streams]
    # per sample: logprobs not sent yet, each event's with the text length its tokens reach; an
    # event's go out once all of its text has (text held back for a stop string holds them too)
    pending: list[list[tuple[list, int]]] = [[] for _ in streams]
    num_sent = [0] * len(streams)  # per sample: logprob entries sent
    text_sent = [0] * len(streams)  # per sample: characters sent (the next chunk's text offset)
    finished: dict[int, RequestOutput] = {}

    def piece_chunk(index: int, text: str, finish_reason):
        reached = len(detokenizers[index].sent)
        entries = [e for group, end in pending[index] if end <= reached for e in group]
        pending[index] = [(group, end) for group, end in pending[index] if end > reached]
        body = chunk(index, text, finish_reason, entries, text_sent[index])
        num_sent[index] += len(entries)
        text_sent[index] += len(text)
        return sse_data(body)

    async def events():
        # sent with the first token, not before it (as vLLM does): a stream's first bytes then mean its prompt is
        # computed, which the replicas' router counts on (a request no longer waiting for its prefill)
        opening = [sse_data(body) for body in first or []]
        try:
            while len(finished) < len(streams):
                index, event = await streams[0].events.get()
                if opening:
                    yield "".join(opening)
                    opening = []
                if isinstance(event, Finished):
                    output = event.output
                    if output.finish_reason == "error":
                        yield sse_data(error_body(output.error, None, "server_error"))
                        yield SSE_DONE
                        return
                    finished[index] = output
                    pending[index] = [(text_logprobs(output, tokenizer)[num_sent[index]:], 0)]
                    yield piece_chunk(index, detokenizers[index].finish(output.text), output.finish_reason)
                    continue
                piece = detokenizers[index].add(event.ids)
                pending[index].append((event.logprobs or [], detokenizers[index].text_len))
                if piece:
                    yield piece_chunk(index, piece, None)
            for body in (last([finished[i] for i in range(len(streams))]) if last else []):
                yield sse_data(body)
            yield SSE_DONE
        finally:  # the client went away (or the streams ended): nothing is left running
            abort_all(loop, streams)

    return StreamingResponse(events(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
