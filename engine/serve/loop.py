"""The engine loop: one thread owns the engine and never waits on a client.

The server runs the loop on the main thread, the thread that built the engine, and HTTP on another:
torch's CPU kernels run slower from a thread other than the one that first ran them (OpenMP's
thread pool belongs to that thread). `start()` runs it on a thread of its own instead, for in-process use.

HTTP handlers hand it `Stream`s through a thread-safe inbox. Between engine iterations the loop
takes in new requests (they join the running batch: continuous batching), aborts the ones whose
client went away (their KV is freed at once), and pushes each request's newly committed token ids
(and their logprobs), then its final output, to the handler's asyncio queue. An exception inside an engine step ends the
requests of that step with an error; the loop itself goes on.
"""

import asyncio
import queue
import threading
from dataclasses import dataclass, field

from eyas.engine.engine import Engine
from eyas.engine.outputs import RequestOutput
from eyas.engine.request import Request, Status
from eyas.engine.sampling_params import SamplingParams


class QueueFull(RuntimeError):
    """More requests wait than `server.max_queue` allows."""


@dataclass
class Finished:
    output: RequestOutput


@dataclass
class Tokens:
    ids: list[int]  # newly generated token ids
    logprobs: list | None = None  # their TokenLogprobs, when the request asked


@dataclass(eq=False)
class Stream:
    """One request (one of a prompt's samples) as the handler sees it: `events` yields (index, Tokens)
    as tokens are generated, then (index, Finished). A prompt's n samples share one queue."""

    prompt_ids: list[int]
    params: SamplingParams
    index: int = 0
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    aio_loop: asyncio.AbstractEventLoop = field(default_factory=asyncio.get_running_loop)
    request: Request | None = None  # set by the engine thread
    num_sent: int = 0
    queued: bool = True  # accepted, not yet running
    done: bool = False

    def push(self, event) -> None:
        try:
            self.aio_loop.call_soon_threadsafe(self.events.put_nowait, (self.index, event))
        except RuntimeError:  # the HTTP side's event loop is closed (shutting down): nobody is listening
            pass


@dataclass
class LoopStats:
    """What the loop last saw, for /metrics (written by the engine thread, read by handlers)."""

    running: int = 0
    waiting: int = 0
    kv_pages_used: int = 0
    kv_pages_total: int = 0
    steps: int = 0
    step_errors: int = 0
    preemptions: int = 0
    mean_accept_length: float = 0.0
    kv_pages_cached: int = 0  # pages the prefix cache keeps
    prefix_cache_hit_rate: float = 0.0  # prompt tokens found cached / prompt tokens admitted


class EngineLoop:
    def __init__(self, engine: Engine, max_queue: int, idle_wait_s: float = 0.05):
        self.engine = engine
        self.on_finished = lambda output: None  # e.g. metrics; called on the engine thread
        self.max_queue = max_queue
        self.idle_wait_s = idle_wait_s
        self.stats = LoopStats(kv_pages_total=engine.scheduler.kv.allocator.num_pages)
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._streams: list[Stream] = []
        self._num_queued = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._running = False
        self._thread: threading.Thread | None = None

    def run(self) -> None:
        """Serve requests on this thread until `stop()`."""
        self._running = True
        try:
            self._run()
        finally:
            self._running = False

    def start(self) -> "EngineLoop":
        """Serve requests on a new thread."""
        self._running = True
        self._thread = threading.Thread(target=self.run, name="eyas-engine-loop", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._inbox.put(None)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=30)

    # ---- called from the HTTP side ----

    @property
    def alive(self) -> bool:
        return self._running and not self._stop.is_set()

    def submit(self, stream: Stream) -> None:
        self.submit_all([stream])

    def submit_all(self, streams: list[Stream]) -> None:
        """Queue the streams together, or none of them when the queue has no room for all."""
        with self._lock:
            if self._num_queued + len(streams) > self.max_queue:
                raise QueueFull(f"{self._num_queued} requests are waiting (server.max_queue = {self.max_queue})")
            self._num_queued += len(streams)
        for stream in streams:
            self._inbox.put(("add", stream))

    def abort(self, stream: Stream) -> None:
        if not stream.done:
            self._inbox.put(("abort", stream))

    def admission_error(self, prompt_ids: list[int], params: SamplingParams) -> str | None:
        """Why the engine could never serve this request (prompt or worst-case KV too large), or None."""
        return self.engine.scheduler.admission_error(Request(-1, prompt_ids, params))

    # ---- the engine thread ----

    def _run(self) -> None:
        while not self._stop.is_set():
            self._take_inbox(block=not self.engine.has_work())
            if self._stop.is_set():
                break
            if self.engine.has_work():
                try:
                    self.engine.step()
                except Exception as e:  # a failed step ends its requests, not the server
                    self.stats.step_errors += 1
                    running = list(self.engine.scheduler.running)
                    self.engine.scheduler.abort(running, f"engine step failed: {type(e).__name__}: {e}", cache=False)
                self.stats.steps += 1
            self._publish()
        for stream in self._streams:  # shutting down: end what is left
            self.engine.abort([stream.request], "server shutting down")
        self._publish()

    def _take_inbox(self, block: bool) -> None:
        try:
            item = self._inbox.get(timeout=self.idle_wait_s) if block else self._inbox.get_nowait()
        except queue.Empty:
            return
        while item is not None:
            kind, stream = item
            if kind == "add":
                try:
                    stream.request = self.engine.submit(prompt_token_ids=[stream.prompt_ids], sampling=[stream.params])[0]
                except Exception as e:  # checked before it got here; should it still be refused, it alone fails
                    stream.request = Request(-1, stream.prompt_ids, stream.params)
                    stream.request.fail(f"request refused by the engine: {e}")
                self._streams.append(stream)
            elif kind == "abort" and stream.request is not None and not stream.request.finished:
                self.engine.abort([stream.request])
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                item = None

    def _publish(self) -> None:
        still = []
        for stream in self._streams:
            request = stream.request
            if stream.queued and request.status is not Status.WAITING:
                stream.queued = False
                with self._lock:
                    self._num_queued -= 1
            if request.finished:
                stream.done = True
                output = self.engine.output(request)
                self.on_finished(output)
                stream.push(Finished(output))
                continue
            if len(request.output_ids) > stream.num_sent:
                logprobs = None if request.logprobs is None else request.logprobs[stream.num_sent:]
                stream.push(Tokens(request.output_ids[stream.num_sent:], logprobs))
                stream.num_sent = len(request.output_ids)
            still.append(stream)
        self._streams = still
        scheduler = self.engine.scheduler
        self.stats.running, self.stats.waiting = len(scheduler.running), len(scheduler.waiting)
        self.stats.kv_pages_used = scheduler.kv.used_pages
        self.stats.preemptions = scheduler.num_preemptions
        self.stats.kv_pages_cached = scheduler.kv.cached_pages
        self.stats.prefix_cache_hit_rate = scheduler.cached_tokens_admitted / max(1, scheduler.prompt_tokens_admitted)
        counters = getattr(self.engine.worker, "counters", None)  # plain decoding has none
        if counters is not None and counters.num_verify_cycles:
            self.stats.mean_accept_length = counters.num_emitted / counters.num_verify_cycles
