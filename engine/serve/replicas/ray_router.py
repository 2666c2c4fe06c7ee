"""The routing policies (`routing`) as a Ray Serve request router, run in the ingress's process.

Ray Serve calls `choose_replicas` for each request the ingress sends to the replica deployment, then
`on_request_routed` and `on_request_completed`; the policy ranks replica ids, the router sends to the least
loaded replica with room in the first rank that has one.
"""

from ray.serve.request_router import PendingRequest, ReplicaID, ReplicaResult, RequestRouter, RunningReplica

from eyas.engine.serve.replicas import router_metrics
from eyas.engine.serve.replicas.routing import make_policy


def routing_text(pending_request: PendingRequest | None) -> str:
    if pending_request is None or not pending_request.args:
        return ""
    return getattr(pending_request.args[0], "routing_text", "") or ""


class EyasRequestRouter(RequestRouter):
    def initialize_state(self, routing: str = "prefix", **prefix_settings):
        self.policy = make_policy(routing, **prefix_settings)
        self.decisions: dict[str, tuple[str, int]] = {}  # internal request id -> (reason, matched chars)

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None) -> list[list[RunningReplica]]:
        by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
        if not by_id:
            return []
        decision = self.policy.rank(routing_text(pending_request), list(by_id))
        if pending_request is not None:
            self.decisions[pending_request.metadata.internal_request_id] = (decision.reason, decision.matched_chars)
        return [[by_id[i] for i in rank] for rank in decision.ranks]

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID, result: ReplicaResult):
        text = routing_text(pending_request)
        self.policy.routed(text, replica_id.unique_id)
        reason, matched = self.decisions.pop(pending_request.metadata.internal_request_id, ("unknown", 0))
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
