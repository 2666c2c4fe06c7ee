"""The replicas' expositions merged for the ingress: each family's HELP and TYPE once, every sample
labelled with its replica, stale posts dropped."""

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from eyas.engine.serve.replicas.metrics_board import MetricsBoard, merge_expositions


def exposition(requests: int, running: int) -> str:
    registry = CollectorRegistry()
    Counter("eyas_requests", "Finished requests", ["finish_reason"], registry=registry).labels("stop").inc(requests)
    Gauge("eyas_requests_running", "Running", registry=registry).set(running)
    return generate_latest(registry).decode()


def test_merged_expositions_parse_with_a_replica_label_on_every_sample():
    text = merge_expositions({"a": exposition(3, 1), "b": exposition(5, 0)})
    assert text.count("# TYPE eyas_requests_running gauge") == 1
    samples = {(s.name, s.labels.get("replica"), s.labels.get("finish_reason")): s.value
               for family in text_string_to_metric_families(text) for s in family.samples}
    assert samples[("eyas_requests_total", "a", "stop")] == 3
    assert samples[("eyas_requests_total", "b", "stop")] == 5
    assert samples[("eyas_requests_running", "a", None)] == 1
    assert all(replica in ("a", "b") for _, replica, _ in samples)
    assert merge_expositions({}) == ""


def test_the_board_drops_a_replica_that_stopped_posting():
    board = MetricsBoard(stale_s=0.0)
    board.post("a", "x", {"pid": 1})
    assert board.read() == {}
    board = MetricsBoard(stale_s=60)
    board.post("a", "x", {"pid": 1})
    assert board.read() == {"a": ("x", {"pid": 1})}
