"""The routing policies (`routing`) as a Ray Serve request router, run in the ingress's process.

Ray Serve calls `choose_replicas` for each request the ingress sends to the replica deployment, then
`on_request_routed` and `on_request_completed`; the policy ranks replica ids, the router sends to the least
loaded replica with room in the first rank that has one. The ingress tells the routers of its process when a
request's answer starts (`routers.answering`, by the request's `ForwardedRequest.key`): a request decoding
loads its replica far less than one waiting for its prefill.
"""

import threading
from dataclasses import dataclass

from ray.serve.request_router import PendingRequest, ReplicaID, ReplicaResult, RequestRouter, RunningReplica

from eyas.engine.serve.replicas import router_metrics, routers
from eyas.engine.serve.replicas.routing import Decision, make_policy

MAX_DECISIONS = 100_000


def forwarded(pending_request: PendingRequest | None):
    if pending_request is None or not pending_request.args:
        return None
    return pending_request.args[0]


def routing_text(pending_request: PendingRequest | None) -> str:
    return getattr(forwarded(pending_request), "routing_text", "") or ""


@dataclass
class Routed:
    decision: Decision
    key: str = ""  # the ingress's
    replica: str | None = None  # where it landed, once Ray Serve reports it
    answered: bool = False


class EyasRequestRouter(RequestRouter):
    def initialize_state(self, routing: str = "prefix", **prefix_settings):
        self.policy = make_policy(routing, **prefix_settings)
        # internal request id -> its decision, until the request completes: Ray Serve may ask again for a request,
        # even after routing it (another of its routing tasks), and gets the same answer
        self.decisions: dict[str, Routed] = {}
        self.request_ids: dict[str, str] = {}  # the ingress's key -> Ray Serve's internal request id
        self.lock = threading.Lock()  # Ray Serve's router loop and the ingress's loop both count
        routers.register(self)

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None) -> list[list[RunningReplica]]:
        by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
        if not by_id:
            return []
        request_id = None if pending_request is None else pending_request.metadata.internal_request_id
        with self.lock:
            routed = self.decisions.get(request_id)
            if routed is None:  # Ray Serve may ask again for a request (its first choices had no room): one decision
                routed = Routed(self.policy.rank(routing_text(pending_request), list(by_id)),
                                getattr(forwarded(pending_request), "key", ""))
                if request_id is not None:
                    if len(self.decisions) > MAX_DECISIONS:  # requests whose completion was never reported
                        self.forget_request(next(iter(self.decisions)))
                    self.decisions[request_id] = routed
                    if routed.key:
                        self.request_ids[routed.key] = request_id
                self.publish()
        ranks = [[by_id[i] for i in rank if i in by_id] for rank in routed.decision.ranks]
        return [rank for rank in ranks if rank] or [list(by_id.values())]

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID, result: ReplicaResult):
        text, replica = routing_text(pending_request), replica_id.unique_id
        with self.lock:
            routed = self.decisions.get(pending_request.metadata.internal_request_id)
            if routed is None:  # not ranked here (cannot happen under Ray Serve's contract): count it where it landed
                routed = Routed(Decision([[replica]], "unknown"))
                self.policy.landed(replica)
            self.policy.routed(text, replica, routed.decision)
            routed.replica = replica
            self.publish()
        decision = routed.decision
        reason, matched = decision.reason, decision.matched_chars
        if replica_id.unique_id != decision.first:
            router_metrics.ELSEWHERE.inc()
        router_metrics.ROUTED.labels(replica_id.unique_id, reason).inc()
        router_metrics.MATCHED_CHARS.inc(matched)
        router_metrics.ROUTED_CHARS.inc(len(text.encode()))

    def answering(self, key: str) -> None:
        with self.lock:
            routed = self.decisions.get(self.request_ids.get(key, ""))
            if routed is not None and routed.replica is not None and not routed.answered:
                routed.answered = True
                self.policy.answering(routed.replica)
                self.publish()

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str):
        with self.lock:
            routed = self.forget_request(internal_request_id)
            self.policy.completed(replica_id.unique_id, answered=routed is not None and routed.answered)
            self.publish()

    def forget_request(self, request_id: str) -> Routed | None:
        routed = self.decisions.pop(request_id, None)
        if routed is not None and self.request_ids.get(routed.key) == request_id:
            del self.request_ids[routed.key]
        return routed

    def publish(self) -> None:
        """The loads the policy counts, as gauges (under the lock)."""
        for replica, count in self.policy.inflight.items():
            router_metrics.IN_FLIGHT.labels(replica).set(count)
            router_metrics.WAITING.labels(replica).set(self.policy.queue(replica))

    def forget_replica(self, replica: str) -> None:
        with self.lock:
            self.policy.forget(replica)
            for gauge in (router_metrics.IN_FLIGHT, router_metrics.WAITING):
                try:
                    gauge.remove(replica)
                except KeyError:
                    pass

    def on_replica_actor_died(self, replica_id: ReplicaID):
        super().on_replica_actor_died(replica_id)
        self.forget_replica(replica_id.unique_id)

    def update_replicas(self, replicas: list[RunningReplica]):
        before = {r.unique_id for r in self._replica_id_set}
        super().update_replicas(replicas)
        for gone in before - {r.unique_id for r in self._replica_id_set}:
            self.forget_replica(gone)
