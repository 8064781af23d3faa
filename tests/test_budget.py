"""Budget policies as pure functions: what to sample next and which labels are settled."""

from __future__ import annotations

import random
from dataclasses import fields

import pytest

from stepq.models.errors import ConfigError
from stepq.models.problems import ProblemSet
from stepq.workers.labelling.budget import Adaptive, Exhaustive, Observation, parse_budget
from stepq.workers.labelling.labels import parse_rule

ABS = parse_rule("abs-q")
RATIO = parse_rule("rel-ratio")
EFF = parse_rule("rel-effective")


def _obs(n: int, outcome: bool, rewards: dict[int, list[int]], m: int = 8, counted: bool = True) -> Observation:
    return Observation(n, m, outcome, {k: dict(enumerate(rs)) for k, rs in rewards.items()}, counted)


def test_exhaustive_asks_for_every_missing_sample_and_labels_when_complete() -> None:
    d = Exhaustive().decide(_obs(2, False, {0: [1, 0, 1, 0], 1: [0] * 8}), ABS)
    assert d.requests == {0: [4, 5, 6, 7]}
    assert d.labels == [False, False], "abs-q of chunk 1 needs only the complete Q(1)"
    assert Exhaustive().decide(_obs(2, False, {0: [1, 0, 1, 0], 1: [0] * 8}), RATIO).labels == [None, False]
    done = Exhaustive().decide(_obs(2, False, {0: [1] + [0] * 7, 1: [0] * 8}), ABS)
    assert done.done and done.labels == [False, False] and done.q == [0.125, 0.0, 0.0]


def test_adaptive_abs_q_needs_nothing_for_a_correct_trajectory() -> None:
    d = Adaptive().decide(_obs(5, True, {}), ABS)
    assert d.done and d.labels == [True] * 5


def test_without_the_trajectory_as_a_sample_a_correct_trajectory_is_sampled() -> None:
    d = Adaptive().decide(_obs(5, True, {}, counted=False), ABS)
    assert not d.done and d.labels[-1] is True


def test_adaptive_abs_q_binary_search_finds_the_first_dead_prefix() -> None:
    # 8 chunks, prefixes 0..3 alive (a success in every round), 4..7 dead.
    n, m = 8, 8
    truth_alive = [k < 4 for k in range(n)]
    rewards: dict[int, dict[int, int]] = {}
    probes = []
    policy = Adaptive(round_size=4, probe=0)  # the search alone
    for _ in range(50):
        d = policy.decide(Observation(n, m, False, rewards, True), ABS)
        if d.done:
            break
        assert len(d.requests) == 1, "abs-q probes one prefix per round"
        ((k, idx),) = d.requests.items()
        probes.append(k)
        for i in idx:
            rewards.setdefault(k, {})[i] = int(truth_alive[k] and i == idx[0])
    assert d.labels == [True, True, True, False, False, False, False, False]
    assert len(set(probes)) <= 4, f"binary search, not a scan: {probes}"
    assert sum(len(v) for v in rewards.values()) < n * (m - 1) / 2


def test_dead_prefix_makes_later_prefixes_dead_and_success_makes_earlier_alive() -> None:
    # prefix 2 has a success, prefix 3 is dead after the full budget (7 rollouts + trajectory).
    d = Adaptive(probe=0).decide(_obs(6, False, {2: [0, 1, 0, 0], 3: [0] * 7}), ABS)
    assert d.labels == [True, True, False, False, False, False]
    assert d.done
    checked = Adaptive().decide(_obs(6, False, {2: [0, 1, 0, 0], 3: [0] * 7}), ABS)
    assert checked.labels == d.labels and sorted(checked.requests) == [4, 5], "by default every skipped one is probed"


def test_relative_rule_chunk_after_a_dead_prefix_is_negative_without_sampling_it() -> None:
    d = Adaptive().decide(_obs(3, False, {0: [1] * 7, 1: [0] * 7}), RATIO)
    assert d.labels[1:] == [False, False]


def test_relative_rule_samples_until_confident() -> None:
    policy = Adaptive(round_size=4, confidence=0.9, min_samples=4)
    d = policy.decide(_obs(2, True, {}), RATIO)
    assert d.requests and d.labels[0] is None, "no decision on the prior alone"
    assert d.labels[1] is True, "Q_n = 1 is never below gamma * Q_{n-1}"
    clear = policy.decide(_obs(2, True, {0: [1, 1, 1, 1, 1, 1, 1], 1: [0, 0, 0, 0, 0, 0, 1]}), RATIO)
    assert clear.labels[0] is False


def test_spent_budget_takes_the_likelier_label() -> None:
    policy = Adaptive(confidence=0.99)
    # All 8 samples spent on each prefix (7 rollouts + the trajectory itself), and no label
    # reaches 0.99 confidence: each takes the side its posterior favours.
    keeps = policy.decide(_obs(2, True, {0: [1, 0, 1, 0, 1, 0, 1], 1: [1, 1, 1, 0, 1, 0, 1]}), RATIO)
    assert keeps.done and keeps.labels[0] is True, "Q 0.625 -> 0.75 keeps the chance"
    drops = policy.decide(_obs(2, True, {0: [1, 0, 1, 0, 1, 0, 1], 1: [1, 0, 0, 0, 0, 0, 0]}), RATIO)
    assert drops.done and drops.labels[0] is False, "Q 0.625 -> 0.25 loses it"


@pytest.mark.parametrize("monotone", [True, False], ids=["monotone-q", "recovering-q"])
@pytest.mark.parametrize("rule", [ABS, RATIO, EFF])
def test_adaptive_always_terminates_within_the_budget(rule: object, monotone: bool) -> None:
    """Also where Q rises again after a drop (a policy that corrects itself) and where a
    dead prefix (Q = 0) is followed by live ones."""
    rng = random.Random(0)
    for _ in range(200):
        n = rng.randint(1, 6)
        q = [rng.choice([0.0, rng.random()]) for _ in range(n)]
        if monotone:
            q.sort(reverse=True)
        outcome = rng.random() < 0.5
        rewards: dict[int, dict[int, int]] = {}
        policy = Adaptive(round_size=rng.randint(1, 5))
        for _ in range(100):
            d = policy.decide(Observation(n, 8, outcome, rewards, rng.random() < 0.5), rule)  # type: ignore[arg-type]
            if d.done:
                break
            for k, idx in d.requests.items():
                assert all(i not in rewards.get(k, {}) and i < 8 for i in idx)
                for i in idx:
                    rewards.setdefault(k, {})[i] = int(rng.random() < q[k])
        assert d.done and all(label is not None for label in d.labels)
        assert all(len(v) <= 8 for v in rewards.values())


def test_parse_budget() -> None:
    assert parse_budget("exhaustive").spec == "exhaustive"
    a = parse_budget("adaptive:confidence=0.9,round=3,min=3")
    assert isinstance(a, Adaptive) and (a.confidence, a.round_size, a.min_samples) == (0.9, 3, 3)
    assert parse_budget(a.spec) == a
    b = parse_budget("adaptive:settle=0,prior=0.5,link=0.2")
    assert isinstance(b, Adaptive) and (b.settle, b.prior, b.link) == (0, 0.5, 0.2)
    assert parse_budget(b.spec) == b and b.spec == "adaptive:settle=0,prior=0.5,link=0.2"
    assert parse_budget("adaptive").spec == "adaptive" == Adaptive().spec, "defaults are not spelled out"
    old = parse_budget("adaptive:confidence=0.75,min=4,round=4")  # a spec stored by an earlier version
    assert old == Adaptive(min_samples=4, round_size=4) and old.spec == "adaptive:min=4,round=4"
    many = parse_budget("adaptive:confidence=0.85,min=5,round=3,probe=0.25")  # over the old 40 characters
    assert isinstance(many, Adaptive) and (many.confidence, many.min_samples, many.probe) == (0.85, 5, 0.25)


def test_stored_budget_spells_out_every_parameter() -> None:
    """What a set stores keeps its meaning when a release changes the defaults: every
    parameter is written, and reading it back needs none of the defaults."""
    for policy in (Adaptive(), Adaptive(confidence=0.9, link=0.0), Adaptive(prior=1e6, settle=0.49)):
        pinned = policy.pinned
        assert parse_budget(pinned) == policy
        keys = dict(part.split("=") for part in pinned.split(":", 1)[1].split(","))
        assert len(keys) == len(fields(Adaptive)), pinned
        assert len(pinned) <= ProblemSet.__table__.c.budget_policy.type.length
    assert parse_budget("exhaustive").pinned == "exhaustive"
    for bad in [
        "lazy",
        "exhaustive:x=1",
        "adaptive:confidence=1.5",
        "adaptive:speed=2",
        "adaptive:round=x",
        "adaptive:settle=0.5",
        "adaptive:prior=0",
        "adaptive:link=1",
    ]:
        with pytest.raises(ConfigError):
            parse_budget(bad)


def test_probes_check_the_dead_prefix_assumption_and_correct_the_labels() -> None:
    # 8 chunks, a wrong trajectory: prefixes 0..2 alive, 3 proven dead (0 of 7 rollouts + the
    # trajectory's own failure), 4..7 inferred dead and never sampled.
    n, m = 8, 8
    rewards = {0: {0: 1}, 2: {0: 1}, 3: dict.fromkeys(range(7), 0)}
    trusting = Adaptive(probe=0.0).decide(Observation(n, m, False, rewards, True, "t"), ABS)
    assert trusting.done and trusting.labels == [True, True, False, False, False, False, False, False]
    checking = Adaptive(probe=1.0).decide(Observation(n, m, False, rewards, True, "t"), ABS)
    assert sorted(checking.requests) == [4, 5, 6, 7] and all(len(v) == 4 for v in checking.requests.values())
    # the probe of prefix 6 finds a success: the policy recovered, so 4..6 are alive after all
    probed = {**rewards, 4: dict.fromkeys(range(4), 0), 5: dict.fromkeys(range(4), 0), 6: {0: 0, 1: 1, 2: 0, 3: 0}}
    probed[7] = dict.fromkeys(range(4), 0)
    after = Adaptive(probe=1.0).decide(Observation(n, m, False, probed, True, "t"), ABS)
    assert after.labels[:3] == [True, True, False], "the proven-dead prefix stays dead"
    assert after.labels[3:6] == [True, True, True], "prefixes before a live probe are alive"
    assert 7 not in after.requests, "a probe is one round: an empty one is not repeated"


def test_the_probed_share_is_a_fixed_draw() -> None:
    from stepq.workers.labelling.budget import probed

    picks = [probed(f"t{i}", k, 0.1) for i in range(2000) for k in range(5)]
    assert 0.08 < sum(picks) / len(picks) < 0.12
    assert picks == [probed(f"t{i}", k, 0.1) for i in range(2000) for k in range(5)], "the same on every call"
    assert not any(probed(f"t{i}", 1, 0.0) for i in range(100)) and all(probed(f"t{i}", 1, 1.0) for i in range(100))
    assert parse_budget("adaptive:probe=0.25").probe == 0.25  # type: ignore[attr-defined]
    with pytest.raises(ConfigError):
        parse_budget("adaptive:probe=2")


def _search(policy: Adaptive, n: int, boundary: int, first_success: int) -> tuple[list[bool | None], int]:
    """Drive an Abs-Q search on a wrong trajectory whose prefixes before ``boundary`` are
    alive (sample ``first_success`` of each is its first success) and the rest dead; returns
    the labels and the chunks the rollouts wrote (a rollout from prefix k writes n - k)."""
    rewards: dict[int, dict[int, int]] = {}
    written = 0
    for _ in range(500):
        d = policy.decide(Observation(n, 16, False, rewards, True, "t"), ABS)
        if d.done:
            return d.labels, written
        for k, idx in d.requests.items():
            for i in idx:
                rewards.setdefault(k, {})[i] = int(k < boundary and i == first_success)
                written += n - k
    raise AssertionError("the search did not end")


@pytest.mark.parametrize("n", [1, 2, 5, 8, 13])
def test_cost_aware_search_finds_every_boundary_exactly(n: int) -> None:
    for boundary in range(n + 1):
        for cost in (0, 1):
            labels, _ = _search(Adaptive(probe=0, cost=cost), n, boundary, first_success=3)
            assert labels == [k < boundary for k in range(1, n + 1)], (n, boundary, cost)


def test_cost_aware_search_leans_to_the_cheap_end() -> None:
    from stepq.workers.labelling.dead_prefix_probe import search_point

    # Prefixes 1, 2, 3 unknown between alive 0 and dead 4 of a 4-chunk trajectory, the first
    # dead one equally likely 1..4; expected chunks written per sample, by first probe:
    #   1: 3 + 3/4·(probe 3: 1, then 2 if 3 is dead (2/3): 2) = 3 + 3/4·(1 + 4/3) = 4.75
    #   2: 2 + 2/4·(probe 3: 1) + 2/4·(probe 1: 3)            = 4
    #   3: 1 + 3/4·(probe 2: 2, then 1 if 2 is dead (2/3): 3) = 1 + 3/4·(2 + 2) = 4
    # (a tie keeps the earlier)
    assert search_point(0, 4, 4) == 2
    for lo, hi, n in [(-1, 8, 8), (-1, 20, 20), (2, 15, 15)]:
        middle = list(range(lo + 1, hi))[(hi - lo - 1) // 2]
        assert lo < search_point(lo, hi, n) < hi
        assert search_point(lo, hi, n) >= middle, "never earlier (dearer) than the middle"
    assert search_point(-1, 8, 8) == 5, "the middle would be 4"


def test_cost_aware_search_generates_fewer_chunks_when_probes_cost_alike() -> None:
    """When an alive prefix costs as many samples as a dead one (its first success is the
    last sample), the search that prices chunks writes fewer of them than the middle's."""
    for n in (8, 16):
        cost_aware = sum(_search(Adaptive(probe=0), n, b, first_success=14)[1] for b in range(n + 1))
        middle = sum(_search(Adaptive(probe=0, cost=0), n, b, first_success=14)[1] for b in range(n + 1))
        assert cost_aware < middle, (n, cost_aware, middle)


def test_a_set_pinned_before_the_cost_aware_search_keeps_its_budget() -> None:
    old = parse_budget("adaptive:confidence=0.75,min=2,round=2,probe=0.1,settle=0.12,prior=1.5,link=0.5")
    assert isinstance(old, Adaptive) and old.cost == 0 and old.probe_samples == 4
    assert parse_budget(old.pinned) == old
    new = parse_budget("adaptive:probe=0.2")  # a spec a person types: today's defaults for the rest
    assert isinstance(new, Adaptive) and new.cost == Adaptive().cost == 1
    assert parse_budget("adaptive:probe_n=8").probe_samples == 8  # type: ignore[attr-defined]
    for bad in ("adaptive:probe_n=0", "adaptive:cost=0.5"):
        with pytest.raises(ConfigError):
            parse_budget(bad)


def test_the_answer_surplus_is_read_from_the_trajectory_itself() -> None:
    from stepq.workers.labelling.dead_prefix_probe import answer_surplus, search_point

    # steps of 22 characters, the last with its answer 52: 52 / 22 - 1 = 1.36, in halves 1.5
    assert answer_surplus([22, 22, 22, 52]) == 1.5
    assert answer_surplus([20, 20, 20]) == 0.0 and answer_surplus([30, 10]) == 0.0, "never below 0"
    assert answer_surplus([10, 10, 500]) == 4.0, "at most 4"
    assert answer_surplus([]) == answer_surplus([40]) == 0.0
    # a long answer makes every probe dearer by the same amount: the search leans less late
    assert search_point(-1, 8, 8, 4.0) <= search_point(-1, 8, 8, 0.0)


def test_siblings_that_share_a_prefix_are_samples_of_it() -> None:
    # 4 chunks, a wrong trajectory, M = 8; three siblings drawn by the same policy from the same
    # prompt: one shares nothing but the prompt and ended right, two share chunk 1 and failed.
    right_from_the_prompt, failed_after_chunk_1 = (0, True), (1, False)
    sibs = (right_from_the_prompt, failed_after_chunk_1, failed_after_chunk_1)
    obs = Observation(4, 8, False, {}, True, "t", siblings=sibs)
    d = Adaptive(probe=0).decide(obs, ABS)
    assert 0 not in d.requests, "prefix 0 is alive (a sibling's success) without a rollout of its own"
    assert d.q[0] == 1 / 4, "prefix 0: the trajectory and its three siblings, one right"
    assert d.q[1] == 0 / 3, "prefix 1: the trajectory and the two that share chunk 1"
    # prefix 1 needs 8 - 3 = 5 rollouts of its own to be proven dead, not 7
    five_failures = {1: dict.fromkeys(range(5), 0)}
    dead_1 = Adaptive(probe=0).decide(Observation(4, 8, False, five_failures, True, "t", siblings=sibs), ABS)
    assert dead_1.done and dead_1.labels == [False, False, False, False]
    # the same rollouts without sibling evidence: prefix 1 has 6 of its 8 samples, not dead yet
    alone = Adaptive(probe=0, siblings=0).decide(Observation(4, 8, False, five_failures, True, "t", siblings=sibs), ABS)
    assert not alone.done and alone.labels[0] is None
    # siblings are samples of the rollout policy only when the trajectory is one
    ingested = Adaptive(probe=0).decide(Observation(4, 8, False, {}, False, "t", siblings=sibs), ABS)
    assert ingested.q[:2] == [None, None]
    assert Exhaustive().decide(obs, ABS).requests[0] == list(range(8)), "exhaustive M ignores them (the paper)"


def test_sibling_evidence_never_exceeds_m() -> None:
    sibs = tuple((3, False) for _ in range(20))
    d = Adaptive(probe=0).decide(Observation(3, 8, False, {}, True, "t", siblings=sibs), ABS)
    assert d.done and d.labels == [False, False, False], "8 failures of every prefix: all dead, nothing drawn"
    assert d.q[:3] == [0.0, 0.0, 0.0]


def test_the_stop_asks_more_gain_of_dear_samples() -> None:
    from stepq.workers.labelling.dead_prefix_probe import stop_scale

    # 5 chunks, no answer surplus: prefixes 0..4 write 5, 4, 3, 2, 1 chunks (mean 3)
    assert stop_scale(1, 5) == 4.5 / 3, "chunk 1 samples prefixes 0 and 1"
    assert stop_scale(3, 5) == 2.5 / 3
    assert stop_scale(5, 5) == 1 / 3, "the last chunk's after-side is the outcome, never sampled"
    assert stop_scale(1, 5, 1.5) == 6.0 / 4.5, "a long answer makes every prefix dearer alike"


@pytest.mark.parametrize("rule", [RATIO, EFF])
def test_a_cost_weighted_stop_stops_early_chunks_sooner_and_late_ones_later(rule: object) -> None:
    """Same evidence, both stops: wherever they disagree, the cost-weighted one stopped on a
    dear (early) chunk or sampled on a cheap (late) one, never the other way round."""
    from stepq.workers.labelling.dead_prefix_probe import stop_scale

    rng = random.Random(11)
    disagreements = 0
    for trial in range(3000):
        n, m = rng.randint(2, 9), 16
        rewards = {k: {i: int(rng.random() < 0.4) for i in range(rng.randint(2, 10))} for k in range(n)}
        obs = Observation(n, m, True, rewards, True, f"t{trial}")
        plain = Adaptive(stop=0).decide(obs, rule)  # type: ignore[arg-type]
        weighted = Adaptive().decide(obs, rule)  # type: ignore[arg-type]
        for i in range(1, n + 1):
            a, b = plain.labels[i - 1], weighted.labels[i - 1]
            if (a is None) != (b is None):
                disagreements += 1
                scale = stop_scale(i, n)
                assert (b is not None and scale > 1) or (b is None and scale < 1), (n, i, scale)
    assert disagreements > 0, "the weighting changes some decisions"


def _labelled(policy: Adaptive, rule: object, q: list[float], key: str, m: int = 16) -> tuple[list[bool | None], int]:
    """Run ``policy`` on one trajectory to the end: ``q`` its prefixes' Q-values and, last, its
    outcome (0 or 1); each rollout a fixed draw, the same for every policy.  Returns the labels
    and the chunks generated."""
    n, rewards, chunks = len(q) - 1, {}, 0  # type: ignore[var-annotated]
    outcome = q[-1] == 1.0
    while True:
        d = policy.decide(Observation(n, m, outcome, rewards, True, key), rule)  # type: ignore[arg-type]
        if d.done:
            return d.labels, chunks
        for k, idx in d.requests.items():
            for i in idx:
                rewards.setdefault(k, {})[i] = int(random.Random(f"{key}-{k}-{i}").random() < q[k])
                chunks += n - k


@pytest.mark.parametrize("rule", [RATIO, EFF])
def test_choosing_the_side_by_gain_per_token_generates_less_for_the_same_labels(rule: object) -> None:
    """An open relative-rule chunk samples the side where a round buys the most accuracy per
    chunk generated (a rollout from the prefix before it writes one chunk more): over many
    trajectories that recover now and then, fewer chunks are generated than by sampling the
    less-known side, and the labels are as often right against the rule on the true Q."""
    rng = random.Random(5)
    totals = {0: [0, 0], 1: [0, 0]}  # side -> [chunks generated, labels right]
    labels_in_all = 0
    for t in range(300):
        n = rng.randint(3, 8)
        q, value = [], rng.uniform(0.5, 0.95)
        for _ in range(n):
            q.append(value)
            value = min(0.98, max(0.02, value * rng.choice([1.0, 1.0, 0.85, 0.5]) + rng.choice([0.0, 0.0, 0.1])))
        q.append(float(rng.random() < value))
        labels_in_all += n
        truth = [rule(q[i - 1], q[i]) for i in range(1, n + 1)]  # type: ignore[operator]
        for side in (0, 1):
            labels, chunks = _labelled(Adaptive(side=side), rule, q, f"t{t}")
            totals[side][0] += chunks
            totals[side][1] += sum(a == b for a, b in zip(labels, truth, strict=True))
    assert totals[1][0] < totals[0][0], totals
    assert totals[1][1] >= totals[0][1] - 0.01 * labels_in_all, totals


def test_an_open_chunk_samples_the_side_that_buys_the_most_per_chunk_generated() -> None:
    """Before: 1 success in 2 samples; after: 1 in 6.  A round of 2 on the before side raises
    the Rel-Ratio label's expected accuracy by 0.094, on the after side by 0.061 (1.55 times
    less).  Near the end of 8 chunks (chunk 7) a rollout from the before side writes 2 chunks
    and one from the after side 1: the after side buys more per chunk.  At chunk 1 they
    write 8 and 7: the before side does.  Sampling the less-known side takes the before side
    both times."""
    from stepq.workers.labelling.posterior import Prefix, settling_gain

    before, after = Prefix(2, 1, more=14), Prefix(6, 1, more=10)
    gains = [
        settling_gain(RATIO, Prefix(2, 1, more=2), Prefix(6, 1), 1.5, 0.5),
        settling_gain(RATIO, Prefix(2, 1), Prefix(6, 1, more=2), 1.5, 0.5),
    ]
    assert [round(g, 3) for g in gains] == [0.094, 0.061]
    policy = Adaptive()
    assert policy.best_buy(RATIO, before, after, 7, 8) == 7, "late: the cheap side"
    assert policy.best_buy(RATIO, before, after, 1, 8) == 0, "early: the informative side"
    assert policy.best_buy(RATIO, Prefix(4, 3, more=12), Prefix(4, 2, more=12), 2, 4) == 2
    assert policy.best_buy(RATIO, Prefix(6, 4, more=10), Prefix(6, 3, more=10), 2, 4) is None, (
        "no round alone would change the label: both sides, as before"
    )


def test_a_set_pinned_before_the_side_choice_keeps_its_budget() -> None:
    """Last release's pinned form (every parameter but ``side``) keeps sampling the
    less-known side; the release before's keeps its older behaviour too."""
    last = Adaptive(side=0).pinned.replace(",side=0", "")
    assert "side" not in last and parse_budget(last) == Adaptive(side=0)
    before = parse_budget("adaptive:confidence=0.75,min=2,round=2,probe=0.1,settle=0.12,prior=1.5,link=0.5")
    assert isinstance(before, Adaptive) and before.side == 0 and before.cost == 0
    assert parse_budget("adaptive:round=3").side == 1  # type: ignore[attr-defined]
    with pytest.raises(ConfigError):
        parse_budget("adaptive:side=0.5")
