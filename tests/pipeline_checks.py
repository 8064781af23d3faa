"""Assertions about a finished annotation, shared by the queue and embedded tests."""

from __future__ import annotations

from sqlalchemy import text

from stepq.models import Database


def assert_exact(db: Database, set_name: str, m: int, *, discarded: bool = False) -> int:
    """Every prefix 0..n-1 has exactly samples 0..m-1; Q-values and labels agree with rows.
    ``discarded``: the set was resampled, so workers wrote rows that were dropped since (the
    written count may exceed the stored one, never fall short).

    Returns the number of rollouts checked.
    """
    with db.engine.connect() as conn:
        trajs = conn.execute(
            text(
                "SELECT t.id, t.n_chunks, t.outcome FROM trajectories t JOIN problems p ON p.id = t.problem_id "
                "JOIN problem_sets s ON s.id = p.problem_set_id WHERE s.name = :n"
            ),
            {"n": set_name},
        ).all()
        assert trajs, "no trajectories"
        # Duplicated work shows as generation, not rows (a unique key keeps rows single): the
        # workers count every rollout they wrote, conflicts included; no batch written twice.
        written = conn.execute(text("SELECT coalesce(sum(rollouts_done), 0) FROM workers")).scalar_one()
        stored = conn.execute(text("SELECT count(*) FROM rollouts")).scalar_one()
        if discarded:
            assert written >= stored
        else:
            assert written == stored, f"{written - stored} rollouts were generated and written twice: " + ", ".join(
                f"{name} counted {done}, stored {kept}"
                for name, done, kept in conn.execute(
                    text(
                        "SELECT w.name, w.rollouts_done, (SELECT count(*) FROM rollouts r WHERE r.worker = w.name) "
                        "FROM workers w"
                    )
                )
                if done != kept
            )
        per_prefix = {
            (tid, k): (n, lo, hi)
            for tid, k, n, lo, hi in conn.execute(
                text(
                    "SELECT trajectory_id, prefix_len, count(*), min(sample_idx), max(sample_idx) FROM rollouts "
                    "GROUP BY trajectory_id, prefix_len"
                )
            )
        }
        total = 0
        for tid, n_chunks, _ in trajs:
            for k in range(n_chunks):
                assert per_prefix.get((tid, k)) == (m, 0, m - 1), f"trajectory {tid} prefix {k}"
                total += m
            assert (tid, n_chunks) not in per_prefix, "the full trajectory is never sampled"
        assert sum(n for n, _, _ in per_prefix.values()) == total
        mismatched = conn.execute(
            text(
                "SELECT q.trajectory_id, q.prefix_len, q.q, avg(r.reward), q.n_samples, count(r.id) FROM q_values q "
                "JOIN rollouts r ON r.trajectory_id = q.trajectory_id AND r.prefix_len = q.prefix_len "
                "GROUP BY q.trajectory_id, q.prefix_len, q.q, q.n_samples "
                "HAVING abs(q.q - avg(r.reward)) > 1e-9 OR q.n_samples <> count(r.id)"
            )
        ).all()
        assert mismatched == []
        n_q = conn.execute(text("SELECT count(*) FROM q_values WHERE source = 'rollouts'")).scalar_one()
        assert n_q == total // m
        outcome_q = {
            tid: q for tid, q in conn.execute(text("SELECT trajectory_id, q FROM q_values WHERE source = 'outcome'"))
        }
        for tid, _, outcome in trajs:
            assert outcome_q[tid] == (1.0 if outcome else 0.0)
        labels = conn.execute(
            text(
                "SELECT count(*), sum(CASE WHEN (l.positive AND l.q_after > 0) OR (NOT l.positive AND l.q_after = 0) "
                "THEN 1 ELSE 0 END) FROM chunk_labels l WHERE l.rule = 'abs-q'"
            )
        ).one()
        assert labels[0] == sum(n for _, n, _ in trajs)
        assert labels[1] == labels[0], "every Abs-Q label is positive iff its Q > 0"
    return total


def label_accuracy(db: Database, set_name: str, rule: str = "abs-q") -> tuple[float, float, int, int]:
    """(share of wrong chunks labelled negative, share of right chunks positive, #wrong, #right)."""
    with db.engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT c.ground_truth, l.positive FROM chunk_labels l JOIN chunks c ON c.id = l.chunk_id "
                "JOIN trajectories t ON t.id = c.trajectory_id JOIN problems p ON p.id = t.problem_id "
                "JOIN problem_sets s ON s.id = p.problem_set_id WHERE s.name = :n AND l.rule = :r"
            ),
            {"n": set_name, "r": rule},
        ).all()
    wrong = [bool(p) for g, p in rows if not g]
    right = [bool(p) for g, p in rows if g]
    return (sum(not p for p in wrong) / len(wrong), sum(right) / len(right), len(wrong), len(right))


def running_items(db: Database) -> int:
    """Work items still running: none once a run has ended, whatever it rode out."""
    with db.engine.connect() as conn:
        return int(conn.execute(text("SELECT count(*) FROM rollout_work WHERE state = 'running'")).scalar_one())
