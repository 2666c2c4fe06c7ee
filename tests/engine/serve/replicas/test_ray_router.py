"""The policy inside Ray Serve's request router contract, without a cluster: one decision per request
however often Ray Serve asks, ranks of the candidates it offers, the text the ingress forwards."""

import asyncio
from types import SimpleNamespace

from eyas.engine.serve.replicas.forwarding import ForwardedRequest
from eyas.engine.serve.replicas import routers
from eyas.engine.serve.replicas.ray_router import EyasRequestRouter

SYSTEM = "You are a careful assistant for a bakery. " * 20


def replica(name: str):
    return SimpleNamespace(replica_id=SimpleNamespace(unique_id=name))


def pending(request_id: str, text: str, key: str = ""):
    return SimpleNamespace(args=[ForwardedRequest("POST", "/v1/completions", routing_text=text, key=key)],
                           kwargs={}, metadata=SimpleNamespace(internal_request_id=request_id))


def router(routing: str) -> EyasRequestRouter:
    made = EyasRequestRouter.__new__(EyasRequestRouter)  # Ray Serve builds it with its own state; the policy's is ours
    made.initialize_state(routing=routing)
    return made


def choose(made, candidates, request):
    return asyncio.run(made.choose_replicas(candidates, request))


def test_one_decision_per_request_however_often_ray_serve_asks():
    made, candidates = router("round_robin"), [replica("a"), replica("b")]
    request = pending("r1", "x")
    first = choose(made, candidates, request)
    assert choose(made, candidates, request) == first  # asked again: the same ranks, the turn not moved on
    made.on_request_routed(request, first[0][0].replica_id, None)
    second = choose(made, candidates, pending("r2", "x"))
    assert second[0][0] is not first[0][0]


def test_requests_sharing_a_prefix_are_ranked_to_the_replica_that_took_the_first():
    made, candidates = router("prefix"), [replica("a"), replica("b"), replica("c")]
    first = pending("r1", SYSTEM + "Q: bread?")
    home = choose(made, candidates, first)[0][0]
    made.on_request_routed(first, home.replica_id, None)
    made.on_request_completed(home.replica_id, "r1")
    for i in range(3):
        request = pending(f"q{i}", SYSTEM + f"Q: {i}?")
        ranks = choose(made, candidates, request)
        assert ranks[0] == [home] and sorted(r.replica_id.unique_id for rank in ranks for r in rank) == ["a", "b", "c"]
        made.on_request_routed(request, home.replica_id, None)


def test_ranks_keep_only_the_replicas_offered():
    made = router("prefix")
    first = pending("r1", SYSTEM)
    home = choose(made, [replica("a"), replica("b")], first)[0][0]
    made.on_request_routed(first, home.replica_id, None)
    other = [r for r in (replica("a"), replica("b")) if r.replica_id.unique_id != home.replica_id.unique_id]
    assert choose(made, other, pending("r2", SYSTEM)) == [other]  # its home not offered (full, or gone)
    assert choose(made, [], pending("r3", SYSTEM)) == []


def test_a_request_stops_waiting_when_the_ingress_has_its_first_part_and_counts_once():
    made, candidates = router("prefix"), [replica("a"), replica("b")]
    requests = [pending(f"r{i}", SYSTEM + f"Q: {i}", key=f"k{i}") for i in range(3)]
    for request in requests:
        home = choose(made, candidates, request)[0][0]
        made.on_request_routed(request, home.replica_id, None)
    name = home.replica_id.unique_id
    assert (made.policy.load(name), made.policy.queue(name)) == (3, 3)
    routers.answering("k0")  # what the ingress calls, for every router of its process
    routers.answering("k0")  # once per request however often it is told
    routers.answering("unknown")
    assert (made.policy.load(name), made.policy.queue(name)) == (3, 2)
    made.on_request_completed(home.replica_id, "r0")  # answered: no longer waiting already
    made.on_request_completed(home.replica_id, "r1")  # never answered (an error before its first part)
    assert (made.policy.load(name), made.policy.queue(name)) == (1, 1)
    assert made.decisions.keys() == {"r2"} and made.request_ids == {"k2": "r2"}
