"""The routing policies (`routing`) as a Ray Serve request router, run in the ingress's process.

Ray Serve calls `choose_replicas` for each request the ingress sends to the replica deployment, then
`on_request_routed` and `on_request_completed`; the policy ranks replica ids, the router sends to the least
loaded replica with room in the first rank that has one.
"""

from ray.serve.request_router import PendingRequest, ReplicaID, ReplicaResult, RequestRouter, RunningReplica

from eyas.engine.serve.replicas import router_metrics
from eyas.engine.serve.replicas.routing import Decision, make_policy

MAX_DECISIONS = 100_000


def routing_text(pending_request: PendingRequest | None) -> str:
    if pending_request is None or not pending_request.args:
        return ""
    return getattr(pending_request.args[0], "routing_text", "") or ""


class EyasRequestRouter(RequestRouter):
    def initialize_state(self, routing: str = "prefix", **prefix_settings):
        self.policy = make_policy(routing, **prefix_settings)
        # internal request id -> its decision, until the request completes: Ray Serve may ask again for a request,
        # even after routing it (another of its routing tasks), and gets the same answer
        self.decisions: dict[str, Decision] = {}

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None) -> list[list[RunningReplica]]:
        by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
        if not by_id:
            return []
        request_id = None if pending_request is None else pending_request.metadata.internal_request_id
        decision = self.decisions.get(request_id)
        if decision is None:  # Ray Serve may ask again for one request (its first choices had no room): one decision
            decision = self.policy.rank(routing_text(pending_request), list(by_id))
            if request_id is not None:
                if len(self.decisions) > MAX_DECISIONS:  # requests whose completion was never reported
                    self.decisions.pop(next(iter(self.decisions)))
                self.decisions[request_id] = decision
        ranks = [[by_id[i] for i in rank if i in by_id] for rank in decision.ranks]
        return [rank for rank in ranks if rank] or [list(by_id.values())]

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID, result: ReplicaResult):
        text = routing_text(pending_request)
        decision = self.decisions.get(pending_request.metadata.internal_request_id)
        if decision is None:  # not ranked here (cannot happen under Ray Serve's contract): count it where it landed
            decision = Decision([[replica_id.unique_id]], "unknown")
            self.policy.inflight[replica_id.unique_id] = self.policy.inflight.get(replica_id.unique_id, 0) + 1
        self.policy.routed(text, replica_id.unique_id, decision)
        reason, matched = decision.reason, decision.matched_chars
        if replica_id.unique_id != decision.first:
            router_metrics.ELSEWHERE.inc()
        router_metrics.ROUTED.labels(replica_id.unique_id, reason).inc()
        router_metrics.MATCHED_CHARS.inc(matched)
        router_metrics.ROUTED_CHARS.inc(len(text.encode()))

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str):
        self.policy.completed(replica_id.unique_id)
        self.decisions.pop(internal_request_id, None)

    def on_replica_actor_died(self, replica_id: ReplicaID):
        super().on_replica_actor_died(replica_id)
        self.policy.forget(replica_id.unique_id)

    def update_replicas(self, replicas: list[RunningReplica]):
        before = {r.unique_id for r in self._replica_id_set}
        super().update_replicas(replicas)
        for gone in before - {r.unique_id for r in self._replica_id_set}:
            self.policy.forget(gone)
