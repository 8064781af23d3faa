"""Hand-made solution files and hand-written rollouts for the ingest and snapshot tests."""

from __future__ import annotations

import json
from pathlib import Path

from sqlalchemy import select

from stepq.models import Database
from stepq.models.problems import Problem
from stepq.models.trajectories import Trajectory


def write_jsonl(path: Path, records: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def solution_records(answer: str = "5", question: str = "What is 2 + 3?") -> list[dict[str, object]]:
    return [
        {"id": "a", "problem": question, "answer": answer, "steps": ["2 + 3 = 5.\n\n", "So \\boxed{5}."]},
        {"id": "b", "problem": "What is 1 + 1?", "answer": "2", "steps": ["1 + 1 = 2.\n\n", "So \\boxed{2}."]},
    ]


def annotated_by_hand(db: Database) -> int:
    """Rollouts for problem a's trajectory as a worker would have written them, work done."""
    from stepq.models import RolloutWork, queries
    from stepq.models.rollouts import Rollout

    with db.session() as s:
        tid = s.scalar(
            select(Trajectory.id).join(Problem, Problem.id == Trajectory.problem_id).where(Problem.external_id == "a")
        )
        assert tid is not None
        rows = [
            {
                "trajectory_id": tid,
                "prefix_len": k,
                "sample_idx": j,
                "seed": j,
                "text": "so \\boxed{5}",
                "final_answer": "5",
                "reward": 1,
                "grade_method": "exact",
                "tokens": 3,
                "generator": "g",
                "worker": "w",
            }
            for k in (0, 1)
            for j in (0, 1)
        ]
        queries.insert_ignore(s, Rollout, rows)
        s.add(
            RolloutWork(
                trajectory_id=tid,
                problem_set_id=queries.get_set(s, "u").id,
                target_m=2,
                state="done",
                attempts=1,
                enqueue_count=1,
            )
        )
        queries.get_set(s, "u").rollouts_per_prefix = 2
    return tid
