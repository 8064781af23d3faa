"""The synthetic policy: deterministic, text-in/text-out, with exactly known step truth."""

from __future__ import annotations

import itertools
import random
from pathlib import Path

from sqlalchemy import text

from stepq.workers.backends import GenerationRequest, SamplingParams, make_backend
from stepq.workers.backends.synthetic_policy import (
    PROMPT_TEMPLATE,
    SMALL_NUMBERS,
    ArithmeticProblem,
    SyntheticPolicy,
    apply,
    exact_q,
    ground_truth,
    make_problem,
    parse_problem,
    true_q,
)
from stepq.workers.data.segmentation import segment
from stepq.workers.grading.grader import Grader
from stepq.workers.seeds import derive_seed


def test_problems_round_trip_through_their_prompt() -> None:
    for seed in range(50):
        p = make_problem(seed)
        assert 3 <= len(p.ops) <= 8
        assert parse_problem(PROMPT_TEMPLATE.format(question=p.question)) == p


def test_default_numbers_keep_their_problems_and_small_numbers_stay_small() -> None:
    """The number ranges are a parameter; the default draws what earlier versions drew (stored
    synthetic sets and their seeds keep their meaning)."""
    assert make_problem(3).question == make_problem(3, 3, 8).question
    for seed in range(200):
        p = make_problem(seed, 1, 3, numbers=SMALL_NUMBERS)
        assert 30 <= p.start <= 60 and 1 <= len(p.ops) <= 3
        assert all(name != "Multiply by" and 1 <= x <= 9 for name, x in p.ops)
        assert parse_problem(PROMPT_TEMPLATE.format(question=p.question)) == p
        steps = SyntheticPolicy(error_rate=0.5, recovery_rate=0.0).solve(p, seed)
        assert all(v > 0 for v in p.true_values())
        value = p.start
        for step, (name, x) in zip(steps, p.ops, strict=True):
            computed = apply(name, value, x)  # what this step's own arithmetic gives
            if step.value != computed and step.value > 0 and computed > 0:
                assert str(step.value)[-1] != str(computed)[-1], "an error shows in the last digit"
            value = step.value
    assert any(name == "Multiply by" for s in range(50) for name, _ in make_problem(s).ops)


def test_error_free_policy_solves_everything() -> None:
    policy = SyntheticPolicy(error_rate=0.0, recovery_rate=0.0)
    for seed in range(30):
        p = make_problem(seed)
        steps = policy.solve(p, seed)
        assert [s.value for s in steps] == p.true_values()
        assert all(ground_truth(steps))
        text = "".join(s.text for s in steps)
        assert Grader().grade(text, str(p.answer)).reward == 1
        assert len(segment(text, "step-markers").chunks) == len(p.ops)


def test_errors_propagate_and_never_land_on_the_truth_by_luck() -> None:
    policy = SyntheticPolicy(error_rate=0.5, recovery_rate=0.0)
    for seed in range(200):
        p = make_problem(seed)
        steps = policy.solve(p, seed)
        truth = ground_truth(steps)
        if not all(truth):
            first = truth.index(False)
            assert all(not t for t in truth[first:])
            assert all(not s.correct for s in steps[first:]), "without recovery an error is never undone"
            assert steps[-1].value != p.answer


def test_recovery_happens_at_its_rate() -> None:
    policy = SyntheticPolicy(error_rate=0.0, recovery_rate=0.5)
    p = make_problem(1)
    rng = random.Random(0)
    wrong_start = p.start + 1
    ends = [policy.continue_steps(p, 0, wrong_start, rng)[-1].value == p.answer for _ in range(400)]
    expected = 1 - 0.5 ** len(p.ops)
    assert abs(sum(ends) / 400 - expected) < 0.08


def test_continuation_reads_the_prefix_and_is_seeded() -> None:
    policy = SyntheticPolicy()
    p = make_problem(4)
    prompt = PROMPT_TEMPLATE.format(question=p.question)
    steps = SyntheticPolicy(error_rate=0.0).solve(p, 1)
    prefix = steps[0].text + steps[1].text
    a = policy.continue_text(prompt, prefix, seed=5)
    assert a == policy.continue_text(prompt, prefix, seed=5)
    assert a.startswith("Step 3: ")
    assert segment(prefix + a, "step-markers").chunks[:2] == (steps[0].text, steps[1].text)
    assert policy.continue_text(prompt, "".join(s.text for s in steps), seed=5) == ""
    others = {policy.continue_text(prompt, prefix, seed=s) for s in range(50)}
    assert len(others) > 1


def test_true_q_matches_the_closed_form_without_recovery() -> None:
    policy = SyntheticPolicy(error_rate=0.2, recovery_rate=0.0)
    p = make_problem(9)
    q = true_q(policy, p, 0, p.start, samples=4000)
    assert abs(q - 0.8 ** len(p.ops)) < 0.03
    assert true_q(policy, p, 0, p.start + 1, samples=500) == 0.0
    assert abs(exact_q(policy, len(p.ops), True) - 0.8 ** len(p.ops)) < 1e-12 and exact_q(policy, 3, False) == 0.0
    recovering = SyntheticPolicy(error_rate=0.2, recovery_rate=0.3)
    assert abs(true_q(recovering, p, 0, p.start + 1, samples=8000) - exact_q(recovering, len(p.ops), False)) < 0.03


def test_backend_batches_with_per_sample_seeds() -> None:
    backend = make_backend("synthetic", {"error_rate": 0.3})
    p = make_problem(2)
    ctx = PROMPT_TEMPLATE.format(question=p.question)
    reqs = [GenerationRequest(ctx, (1, 2, 3)), GenerationRequest(ctx, (1,))]
    out = backend.generate(reqs, SamplingParams())
    assert [len(o) for o in out] == [3, 1]
    assert out[0][0] == out[1][0], "same seed, same context, same completion"
    assert all(c.tokens == len(c.text.split()) > 0 for o in out for c in o)
    assert all(c.prompt_tokens == len(ctx.split()) for o in out for c in o)


def test_derive_seed_is_stable_and_31_bit() -> None:
    assert derive_seed("a", 1, 2) == derive_seed("a", 1, 2)
    assert derive_seed("a", 1, 2) != derive_seed("a", 2, 1)
    assert all(0 <= derive_seed(i) < 2**31 for i in range(100))


HARD_MULTIPLY = SyntheticPolicy(
    error_rate=0.05, recovery_rate=0.3, op_error_rates=(("Multiply by", 0.4), ("Subtract", 0.15)), slip_rate=0.2
)


def assert_q_matches_monte_carlo(policy: SyntheticPolicy, p: ArithmeticProblem, seed: int) -> None:
    """The closed-form Q of a solution's first and middle prefixes against sampled continuations."""
    from stepq.workers.backends.synthetic_policy import trajectory_q

    steps = policy.solve(p, seed)
    q = trajectory_q(policy, p, steps)
    for k in (0, len(p.ops) // 2):
        value = steps[k - 1].value if k else p.start
        mc = true_q(policy, p, k, value, samples=6000, seed=seed)
        assert abs(mc - q[k]) < 0.025, (seed, k, mc, q[k])


def test_exact_q_with_per_operation_rates_and_recovery_matches_monte_carlo() -> None:
    checked = 0
    for seed in range(40):
        p = make_problem(seed)
        names = {name for name, _ in p.ops}
        if not {"Multiply by", "Add"} <= names:
            continue
        assert_q_matches_monte_carlo(HARD_MULTIPLY, p, seed)
        checked += 1
        if checked == 4:
            break
    assert checked == 4


def test_per_operation_rates_make_steps_differ_in_difficulty() -> None:
    policy = SyntheticPolicy(error_rate=0.0, recovery_rate=0.0, op_error_rates=(("Multiply by", 0.5),))
    wrong_at: dict[str, int] = {}
    for seed in range(300):
        p = make_problem(seed)
        steps = policy.solve(p, seed)
        truth = ground_truth(steps)
        if not all(truth):
            op = p.ops[truth.index(False)][0]
            wrong_at[op] = wrong_at.get(op, 0) + 1
    assert set(wrong_at) == {"Multiply by"}, "only multiplications go wrong"


def test_recovery_makes_q_non_monotone() -> None:
    from stepq.workers.backends.synthetic_policy import trajectory_q

    rises = 0
    for seed in range(300):
        p = make_problem(seed)
        steps = HARD_MULTIPLY.solve(p, seed)
        q = trajectory_q(HARD_MULTIPLY, p, steps)
        rises += any(b > a + 0.2 for a, b in itertools.pairwise(q))
    assert rises >= 10, "a wrong prefix followed by a recovered one: Q goes back up"


def test_slips_are_process_errors_that_leave_the_answer_alone() -> None:
    policy = SyntheticPolicy(error_rate=0.0, recovery_rate=0.0, slip_rate=0.5)
    slipped = 0
    for seed in range(50):
        p = make_problem(seed)
        steps = policy.solve(p, seed)
        assert steps[-1].value == p.answer and all(s.correct for s in steps), "every value stays right"
        if any(s.slip for s in steps):
            slipped += 1
            assert ground_truth(steps)[[s.slip for s in steps].index(True)] is False
        text = "".join(s.text for s in steps)
        assert Grader().grade(text, str(p.answer)).reward == 1
        prefix = "".join(s.text for s in steps[:2])
        prompt = PROMPT_TEMPLATE.format(question=p.question)
        assert policy.continue_text(prompt, prefix, 3).endswith(f"\\boxed{{{p.answer}}}."), "slips are parsed through"
    assert slipped > 20


def test_a_synthetic_set_of_small_numbers_is_annotated_from_its_own_problems(tmp_path: Path) -> None:
    """``numbers="small"``: one-digit additions and subtractions from a two-digit start, kept in
    the set's config (growing it with other numbers is refused), continued by the policy."""
    import re

    import pytest

    from stepq.assembly import worker_runtime
    from stepq.migrations import upgrade
    from stepq.models import Database
    from stepq.models.errors import ConfigError
    from stepq.workers.annotation_plans import configure_annotation
    from stepq.workers.data.synthetic_set import synth_set
    from stepq.workers.in_process import run_in_process
    from stepq.workers.jobqueue.runtime import WorkerOptions

    url = f"sqlite:///{tmp_path / 's.db'}"
    upgrade(url)
    db = Database(url)
    synth_set(db, "small", problems=6, seed=1, numbers="small")
    with pytest.raises(ConfigError, match="same settings"):
        synth_set(db, "small", problems=7, seed=1)
    configure_annotation(db, "small", 2)
    run_in_process(db, worker_runtime(db, WorkerOptions(name="t")))
    with db.engine.connect() as conn:
        questions = [q for (q,) in conn.execute(text("SELECT question FROM problems"))]
        rollouts = conn.execute(text("SELECT count(*) FROM rollouts")).scalar_one()
    assert len(questions) == 6 and rollouts > 0
    for q in questions:
        start = int(re.match(r"Start with (\d+)\.", q).group(1))  # type: ignore[union-attr]
        assert 30 <= start <= 60 and "Multiply" not in q
        assert all(1 <= int(x) <= 9 for x in re.findall(r"(?:Add|Subtract) (\d+)\.", q))


KINDS = SyntheticPolicy(
    error_rate=0.3, recovery_rate=0.2, error_kinds=(("operand", 1.0), ("operation", 1.0), ("carry", 1.0))
)


def test_errors_that_need_the_problem_or_the_history_compute_right_and_are_wrong() -> None:
    """An operand, operation or carry error writes arithmetic that is right in itself: the step
    alone (a op x = v) cannot show it, the problem or the step before it does."""
    from stepq.workers.backends.synthetic_policy import step_is_right, step_locally_right

    seen: dict[str, int] = {"operand": 0, "operation": 0, "carry": 0}
    for seed in range(200):
        p = make_problem(seed, numbers=SMALL_NUMBERS)
        steps = KINDS.solve(p, seed)
        texts = [s.text for s in steps]
        truth = p.true_values()
        for k, step in enumerate(steps):
            if step.value == truth[k]:
                continue  # right, or recovered (a recovery writes the true value whatever it read)
            shown, op, x, result = step.text.split(":")[1].split(".")[0].replace("=", "").split()
            symbol = {"+": "Add", "-": "Subtract", "*": "Multiply by"}[op]
            assert apply(symbol, int(shown), int(x)) == int(result), "the step's own arithmetic is right"
            before = steps[k - 1].value if k else p.start
            if before != (truth[k - 1] if k else p.start):
                continue  # after an earlier error
            assert step_is_right(p.question, texts[:k], step.text) is False
            assert step_locally_right(p.question, texts[:k], step.text) is False
            name, operand = p.ops[k]
            kind = "carry" if int(shown) != before else "operation" if symbol != name else "operand"
            assert kind != "operand" or int(x) != operand
            seen[kind] += 1
    assert min(seen.values()) >= 20, seen


def test_error_kinds_change_what_an_error_is_not_how_often_one_happens() -> None:
    """Every Q-value stays the closed form: the kind is drawn only once an error is."""
    for seed in range(3):
        assert_q_matches_monte_carlo(KINDS, make_problem(seed, numbers=SMALL_NUMBERS), seed)


def test_error_kinds_travel_with_the_set_and_name_the_generator(tmp_path: Path) -> None:
    import pytest

    from stepq.migrations import upgrade
    from stepq.models import Database
    from stepq.models.errors import ConfigError
    from stepq.workers.backends.synthetic import SyntheticBackend
    from stepq.workers.data.synthetic_set import synth_set

    url = f"sqlite:///{tmp_path / 's.db'}"
    upgrade(url)
    db = Database(url)
    synth_set(db, "kinds", problems=3, error_kinds={"carry": 2.0, "operand": 1.0})
    with db.session() as s:
        config = s.execute(text("SELECT backend_config FROM problem_sets WHERE name = 'kinds'")).scalar_one()
    backend = SyntheticBackend.from_config(config if isinstance(config, dict) else __import__("json").loads(config))
    assert backend.policy.error_kinds == (("carry", 2.0), ("operand", 1.0))
    assert "carry-errors=2" in backend.generator and "operand-errors=1" in backend.generator
    assert "errors" not in SyntheticBackend().generator, "the default policy keeps its name"
    with pytest.raises(ConfigError, match="unknown error kind"):
        SyntheticBackend(error_kinds={"typo": 1.0})
    with pytest.raises(ConfigError, match="positive"):
        SyntheticBackend.from_config({"error_kinds": {"carry": 0}})
