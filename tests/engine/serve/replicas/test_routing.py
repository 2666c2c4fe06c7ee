"""The routing policies without Ray: a shared prefix follows the replica that was sent it, load bounds that,
new prefixes spread, and the index forgets (LRU per replica, and a replica that is gone)."""

from eyas.engine.serve.replicas.prefix_index import PrefixIndex
from eyas.engine.serve.replicas.routing import PowerOfTwoPolicy, PrefixPolicy, RoundRobinPolicy, make_policy

SYSTEM_A = "You are a careful assistant for a bakery. " * 20
SYSTEM_B = "You answer questions about the railway timetable. " * 20
REPLICAS = ["r0", "r1", "r2"]


def route(policy, text, replicas=REPLICAS):
    decision = policy.rank(text, replicas)
    policy.routed(text, decision.first, decision)
    return decision.first, decision


def test_the_index_matches_whole_chunks_of_a_chain():
    index = PrefixIndex(chunk_chars=8, max_chunks=100)
    index.insert("a", index.keys("0123456789abcdefXYZ"))
    assert index.matched_chars(index.keys("0123456789abcdefQQQQQQQQ")) == {"a": 16}
    assert index.matched_chars(index.keys("0123456789abcdeQ")) == {"a": 8}
    # the same chunk after another prefix is another key: a chain, not a bag of chunks
    assert index.matched_chars(index.keys("XXXXXXXX89abcdef")) == {"a": 0}
    assert index.keys("short") == []


def test_the_index_forgets_the_least_recently_routed_chunks_first():
    index = PrefixIndex(chunk_chars=4, max_chunks=3)
    index.insert("a", index.keys("aaaabbbbcccc"))
    index.insert("a", index.keys("zzzz"))
    assert index.matched_chars(index.keys("aaaabbbbcccc")) == {"a": 0}  # its first chunk went first
    assert index.matched_chars(index.keys("zzzz")) == {"a": 4}
    index.remove("a")
    assert index.matched_chars(index.keys("zzzz")) == {}


def test_requests_sharing_a_prefix_follow_the_first_and_new_prefixes_spread():
    policy = PrefixPolicy(seed=0)
    first_a, decision = route(policy, SYSTEM_A + "Q: bread?")
    assert decision.reason == "no_prefix"
    first_b, _ = route(policy, SYSTEM_B + "Q: first train?")
    assert first_b != first_a  # replicas take new prefixes in turn
    for question in ("rye?", "cake?", "opening hours?"):
        chosen, decision = route(policy, SYSTEM_A + "Q: " + question)
        assert (chosen, decision.reason) == (first_a, "prefix") and decision.matched_chars > 0
        policy.completed(chosen)


def test_a_prefix_is_followed_only_while_its_replica_is_within_max_imbalance():
    policy = PrefixPolicy(max_imbalance=2, seed=0)
    home, _ = route(policy, SYSTEM_A + "Q: 0")
    chosen = [route(policy, SYSTEM_A + f"Q: {i}") for i in range(1, 5)]
    assert [c for c, _ in chosen[:2]] == [home, home]  # loads 1, 2 over 0: within 2
    (spill, decision), (then, then_decision) = chosen[2:]
    assert spill != home and decision.reason == "balance"  # 3 over 0: load wins
    assert (then, then_decision.reason) == (spill, "prefix")  # and the prefix is now held there too


def test_requests_waiting_for_a_first_token_bound_a_prefix_and_requests_in_flight_only_past_a_ratio():
    """A replica whose batch is decoding takes new requests in its next step; a queue of prefills is what a new
    request waits behind. Requests in flight bound it too, past `max_load_ratio` of the least loaded's."""
    policy = PrefixPolicy(max_imbalance=2, max_load_ratio=1.5, seed=0)
    home, _ = route(policy, SYSTEM_A + "Q: 0", ["r0", "r1"])
    other = next(r for r in ["r0", "r1"] if r != home)
    policy.inflight, policy.waiting = {home: 9, other: 8}, {home: 0, other: 0}  # up to 12: 1.5 times, within
    waiting = [route(policy, SYSTEM_A + f"Q: w{i}", ["r0", "r1"])[0] for i in range(4)]
    assert waiting[:3] == [home] * 3 and waiting[3] == other  # 3 waiting over 0: load wins
    assert (policy.load(home), policy.queue(home)) == (12, 3)
    policy.answering(home)
    policy.completed(home, answered=True)
    policy.completed(home, answered=False)
    assert (policy.load(home), policy.queue(home)) == (10, 1)

    policy = PrefixPolicy(max_imbalance=2, max_load_ratio=1.5, seed=0)
    home, _ = route(policy, SYSTEM_A + "Q: 0", ["r0", "r1"])
    other = next(r for r in ["r0", "r1"] if r != home)
    policy.inflight, policy.waiting = {home: 7, other: 4}, {}  # 3 more, 1.75 times: too loaded
    assert route(policy, SYSTEM_A + "Q: 1", ["r0", "r1"])[1].reason == "balance"
    # the least loaded in flight has a queue: the replicas with a short queue are within
    policy.inflight, policy.waiting = {home: 30, other: 5}, {home: 0, other: 6}
    assert route(policy, SYSTEM_A + "Q: 2", ["r0", "r1"])[0] == home


def test_a_short_match_does_not_decide():
    policy = PrefixPolicy(min_match_ratio=0.5, chunk_chars=16, seed=0)
    home, _ = route(policy, "x" * 64 + "a" * 16)
    policy.completed(home)
    other, _ = route(policy, "y" * 64)
    policy.completed(other)
    chosen, decision = route(policy, "x" * 32 + "b" * 96)  # 32 of 128 matched: under half
    assert decision.reason == "no_prefix"


def test_a_request_landing_elsewhere_is_recorded_where_it_landed_and_a_gone_replica_forgotten():
    policy = PrefixPolicy(seed=0)
    text = SYSTEM_A + "Q: 1"
    decision = policy.rank(text, REPLICAS)
    landed = decision.ranks[1][0]  # its first choice had no room
    policy.routed(text, landed, decision)
    assert policy.index.matched_chars(policy.index.keys(text))[landed] > 0
    assert policy.inflight[landed] == 1 and policy.inflight[decision.first] == 0  # counted where it landed
    policy.forget(landed)
    assert landed not in policy.index.matched_chars(policy.index.keys(text))
    assert landed not in policy.inflight


def test_round_robin_takes_turns_and_power_of_two_picks_the_less_loaded():
    robin = RoundRobinPolicy()
    assert [route(robin, "x")[0] for _ in range(6)] == ["r0", "r1", "r2", "r0", "r1", "r2"]
    two = PowerOfTwoPolicy(seed=0)
    two.inflight = {"r0": 5, "r1": 0}
    for _ in range(10):
        assert two.choose("x", ["r0", "r1"]).ranks[0] == ["r1"]


def test_every_rank_lists_each_replica_once():
    for routing in ("prefix", "power_of_two", "round_robin"):
        policy = make_policy(routing)
        for i in range(5):
            ranks = policy.rank(SYSTEM_A + str(i), REPLICAS).ranks
            assert sorted(r for rank in ranks for r in rank) == REPLICAS


def test_a_burst_ranked_before_any_request_lands_is_still_load_bounded():
    """Ray Serve may rank many requests before reporting any routed: each counts on its first choice at once."""
    policy = PrefixPolicy(max_imbalance=2, seed=0)
    firsts = []
    for i in range(8):
        firsts.append(policy.rank(SYSTEM_A + f"Q: {i}", ["r0", "r1"]).first)
        assert abs(policy.load("r0") - policy.load("r1")) <= 3  # the bound, and the one ranked past it
    assert sum(policy.inflight.values()) == 8
    assert firsts[:3] == [firsts[0]] * 3  # the prefix is followed while the bound allows
    assert set(firsts[3:]) == {"r0", "r1"}  # then both hold it and take it in turn


def test_of_the_replicas_holding_a_prefix_the_one_first_sent_it_takes_it_within_the_bound():
    """A spill leaves a prompt's copy on a second replica: its requests go back to the first one once that is
    within the bound again, so the copy goes cold instead of crowding both replicas' caches."""
    policy = PrefixPolicy(max_imbalance=2, seed=0)
    home, _ = route(policy, SYSTEM_A + "Q: earlier", ["r0", "r1"])
    policy.answering(home)
    other = next(r for r in ["r0", "r1"] if r != home)
    policy.inflight = {home: 6, other: 3}  # more in flight at home, within max_load_ratio
    firsts = [policy.rank(SYSTEM_A + f"Q: {i}", ["r0", "r1"]).first for i in range(4)]
    assert firsts == [home] * 3 + [other]  # the bound on waiting requests spilled the fourth
    assert policy.index.matched_chars(policy.index.keys(SYSTEM_A))[other] > 0  # which holds the prompt now too
    for _ in range(3):
        policy.answering(home)
    after = [policy.rank(SYSTEM_A + f"Q: after {i}", ["r0", "r1"]).first for i in range(2)]
    assert after == [home, home]  # back to its owner, not in turn
    policy.forget(home)  # gone: its prompts are owned by nobody, and the other replica takes them
    assert policy.rank(SYSTEM_A + "Q: last", [other]).first == other
    assert policy.owners[policy.index.keys(SYSTEM_A)[0]] == other


def test_a_longer_match_wins_over_the_owner_of_a_shorter_one():
    policy = PrefixPolicy(max_imbalance=4, seed=0)
    route(policy, SYSTEM_A + "Q: earlier", ["r0"])  # r0 owns the system prompt
    # a request sharing only the system prompt with where it goes, while the other replica held its whole
    # conversation: the longer match wins
    conversation = SYSTEM_A + "Q: earlier" + " A: a long answer about bread and its baking" * 8
    policy.index.insert("r1", policy.index.keys(conversation))
    assert [route(policy, conversation + f" Q: more {i}", ["r0", "r1"])[0] for i in range(2)] == ["r1", "r1"]
