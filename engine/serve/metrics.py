"""Prometheus metrics of the server (`GET /metrics`), in a registry of its own."""

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from eyas.engine.outputs import RequestOutput
from eyas.engine.serve.loop import EngineLoop

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class ServerMetrics:
    def __init__(self, loop: EngineLoop):
        self.registry = registry = CollectorRegistry()
        self.requests = Counter("eyas_requests", "Finished requests by finish reason", ["finish_reason"],
                                registry=registry)
        self.refused = Counter("eyas_requests_refused", "Requests refused before reaching the engine, by HTTP status",
                               ["status"], registry=registry)
        self.prompt_tokens = Counter("eyas_prompt_tokens", "Prompt tokens of finished requests", registry=registry)
        self.cached_tokens = Counter("eyas_prompt_tokens_cached", "Prompt tokens of finished requests whose KV the "
                                     "prefix cache held", registry=registry)
        self.generation_tokens = Counter("eyas_generation_tokens", "Tokens generated", registry=registry)
        self.ttft = Histogram("eyas_time_to_first_token_seconds", "Time to first token", buckets=LATENCY_BUCKETS,
                              registry=registry)
        self.latency = Histogram("eyas_request_latency_seconds", "Request latency", buckets=LATENCY_BUCKETS,
                                 registry=registry)
        stats = loop.stats
        gauges = {
            "eyas_requests_running": ("Requests in the running batch", lambda: stats.running),
            "eyas_requests_waiting": ("Requests waiting for KV or a batch slot", lambda: stats.waiting),
            "eyas_kv_pages_used": ("KV pages held by requests", lambda: stats.kv_pages_used),
            "eyas_kv_pages_total": ("KV pages in the pool", lambda: stats.kv_pages_total),
            "eyas_kv_pages_cached": ("KV pages the prefix cache keeps (those no request holds are evictable)",
                                     lambda: stats.kv_pages_cached),
            "eyas_prefix_cache_hit_rate": ("Prompt tokens found in the prefix cache / prompt tokens admitted",
                                           lambda: stats.prefix_cache_hit_rate),
            "eyas_kv_usage_ratio": ("Fraction of KV pages held", lambda: stats.kv_pages_used / stats.kv_pages_total),
            "eyas_engine_steps": ("Engine iterations run", lambda: stats.steps),
            "eyas_engine_step_errors": ("Engine iterations that raised", lambda: stats.step_errors),
            "eyas_preemptions": ("Requests whose KV was taken back for an older one", lambda: stats.preemptions),
            "eyas_mean_accept_length": ("Tokens emitted per verify cycle (tau), bonus included",
                                        lambda: stats.mean_accept_length),
        }
        graphs = loop.engine.graphs  # graphs.mode=auto: runners compiled in the background
        if graphs is not None:
            gauges["eyas_graphs_swapped_in"] = ("1 once the graph runners compiled in the background run the steps",
                                                lambda: float(graphs.state == "graphs"))
            gauges["eyas_graphs_compile_seconds"] = ("Seconds the background compile of the graph runners ran (so far)",
                                                     lambda: graphs.stats()["graphs_compile_s"])
            gauges["eyas_graphs_packages_compiled"] = ("Graph packages the background compile has written (so far)",
                                                       lambda: float(graphs.packages_written))
        for name, (doc, read) in gauges.items():
            Gauge(name, doc, registry=registry).set_function(read)

    def observe(self, output: RequestOutput) -> None:
        self.requests.labels(output.finish_reason).inc()
        if output.finish_reason in ("stop", "length"):
            self.prompt_tokens.inc(len(output.prompt_token_ids))
            self.cached_tokens.inc(output.stats.get("cached_tokens", 0))
            self.generation_tokens.inc(len(output.token_ids))
            if "time_to_first_token_s" in output.stats:
                self.ttft.observe(output.stats["time_to_first_token_s"])
            self.latency.observe(output.stats["latency_s"])

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
