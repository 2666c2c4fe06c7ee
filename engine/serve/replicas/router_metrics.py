"""The ingress's own Prometheus metrics: where the router sent requests and why, the loads it counts, retries and
failures.

One registry per ingress process, shared by the router (which Ray Serve builds inside that process) and the
ingress's `/metrics`, which adds the replicas' own metrics after these.
"""

from prometheus_client import CollectorRegistry, Counter, Gauge

REGISTRY = CollectorRegistry()
ROUTED = Counter("eyas_router_requests", "Requests routed, by replica and reason (prefix, balance: its prefix's "
                 "replicas were too loaded, no_prefix, power_of_two, round_robin)", ["replica", "reason"],
                 registry=REGISTRY)
MATCHED_CHARS = Counter("eyas_router_matched_chars", "Characters of routed requests' text that their replica was "
                        "sent before (prefix routing)", registry=REGISTRY)
ROUTED_CHARS = Counter("eyas_router_text_chars", "Characters of routed requests' text", registry=REGISTRY)
ELSEWHERE = Counter("eyas_router_first_choice_passed_over", "Requests sent to another replica than the policy's "
                    "first choice (it had no room, or did not tell its queue length in time)", registry=REGISTRY)
RETRIED = Counter("eyas_router_retries", "Requests sent again to another replica after theirs died before "
                  "their first token", registry=REGISTRY)
FAILED = Counter("eyas_router_failures", "Requests ended with an error by the ingress, by cause", ["cause"],
                 registry=REGISTRY)
IN_FLIGHT = Gauge("eyas_router_requests_in_flight", "Requests routed to a replica and not completed, as the router "
                  "counts them", ["replica"], registry=REGISTRY)
WAITING = Gauge("eyas_router_requests_waiting", "Requests routed to a replica whose answer has not started (no first "
                "token yet), as the router counts them: what prefix routing bounds (max_imbalance)", ["replica"],
                registry=REGISTRY)
