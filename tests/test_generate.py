"""Policy sampling (incremental, prompt filter), LLM segmentation and its fallback."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest
from sqlalchemy import func, select, text

from stepq.assembly import worker_runtime
from stepq.models import Database, Problem, RolloutWork, Trajectory, queries
from stepq.models.errors import ConfigError
from stepq.workers.annotation_plans import configure_annotation
from stepq.workers.backends import Completion, GenerationRequest, SamplingParams, make_backend
from stepq.workers.backends.openai_server import OpenAICompletionsBackend
from stepq.workers.backends.synthetic_policy import make_problem
from stepq.workers.backends.synthetic_server import SyntheticCompletionsServer
from stepq.workers.data.ingest import FieldMap, ingest_file
from stepq.workers.data.llm_segment import SEGMENT_PROMPT, boundaries, segment_with_model
from stepq.workers.data.policy_sampling import generate_trajectories
from stepq.workers.data.prompts import TEMPLATES, load_template, render
from stepq.workers.data.segmentation import split_step_markers
from tests.helpers import annotated_set


def _problems(db: Database, tmp_path: Path, n: int = 12) -> None:
    f = tmp_path / "arith.jsonl"
    rows = [
        {"id": f"p{i}", "question": (p := make_problem(100 + i)).question, "answer": str(p.answer)} for i in range(n)
    ]
    f.write_text("\n".join(json.dumps(r) for r in rows))
    ingest_file(db, f, "gen", FieldMap())


def _count(db: Database) -> int:
    with db.session() as s:
        return int(s.scalar(select(func.count(Trajectory.id))) or 0)


def test_generate_is_incremental_and_stores_what_the_policy_wrote(any_db: Database, tmp_path: Path) -> None:
    _problems(any_db, tmp_path)
    backend = make_backend("synthetic")
    template = load_template("synthetic")
    report = generate_trajectories(any_db, "gen", backend, samples=3, template=template, params=SamplingParams())
    assert report.new_trajectories == 36 and report.segmentation == {"step-markers": 36}
    with any_db.session() as s:
        trajs = list(s.scalars(select(Trajectory)))
        problems = {p.id: p for p in s.scalars(select(Problem))}
        for t in trajs:
            chunks = queries.trajectory_chunks(s, t.id)
            assert "".join(c.text for c in chunks) == t.text and len(chunks) == t.n_chunks
            p = problems[t.problem_id]
            assert t.prompt == render(template, p.question)
            assert t.outcome == (t.final_answer == p.reference_answer)
            assert t.generator == "synthetic(err=0.1,rec=0.001)[t=1,p=1,max=8192]"
    again = generate_trajectories(any_db, "gen", backend, samples=5, template=template, params=SamplingParams())
    assert again.new_trajectories == 24 and _count(any_db) == 60
    assert (
        generate_trajectories(
            any_db, "gen", backend, samples=5, template=template, params=SamplingParams()
        ).new_trajectories
        == 0
    )


def test_prompt_filter_excludes_all_right_and_all_wrong_problems(sqlite: Database, tmp_path: Path) -> None:
    _problems(sqlite, tmp_path, n=30)
    report = generate_trajectories(
        sqlite,
        "gen",
        make_backend("synthetic", {"error_rate": 0.15}),
        samples=4,
        template=load_template("synthetic"),
        params=SamplingParams(),
        filter_mixed=True,
    )
    with sqlite.session() as s:
        outcomes: dict[int, set[bool]] = {}
        for t in s.scalars(select(Trajectory)):
            outcomes.setdefault(t.problem_id, set()).add(bool(t.outcome))
        excluded = {p.id for p in s.scalars(select(Problem).where(Problem.excluded.is_(True)))}
    assert excluded == {pid for pid, o in outcomes.items() if len(o) == 1}
    assert 0 < report.excluded_problems == len(excluded) < 30
    configure_annotation(sqlite, "gen", 2)
    with sqlite.session() as s:
        planned = {t for (t,) in s.execute(select(RolloutWork.trajectory_id))}
        kept = {t.id for t in s.scalars(select(Trajectory)) if t.problem_id not in excluded}
    assert planned == kept, "excluded problems are never annotated"


def test_generate_through_an_openai_compatible_server(sqlite: Database, tmp_path: Path) -> None:
    _problems(sqlite, tmp_path, n=4)
    server = SyntheticCompletionsServer().start()
    try:
        backend = OpenAICompletionsBackend(server.url, "synthetic")
        report = generate_trajectories(
            sqlite, "gen", backend, samples=2, template=load_template("synthetic"), params=SamplingParams()
        )
    finally:
        server.stop()
    assert report.new_trajectories == 8
    with sqlite.session() as s:
        assert {t.generator for t in s.scalars(select(Trajectory))} == {"openai:synthetic[t=1,p=1,max=8192]"}
        prompts = {t.prompt for t in s.scalars(select(Trajectory))}
    assert prompts == set(server.prompts)


class StandInSegmenter:
    """A stand-in for a segmenting model: tags the solution at its 'Step n:' markers, or,
    when ``sloppy``, also changes one character (which must be rejected)."""

    name = "stand-in-segmenter"
    generator = "stand-in-segmenter"

    def __init__(self, sloppy: bool = False) -> None:
        self.sloppy = sloppy

    def generate(self, requests: Sequence[GenerationRequest], params: SamplingParams) -> list[list[Completion]]:
        out = []
        for req in requests:
            solution = req.context.split("Solution:\n", 1)[1].rsplit("\n\nTagged solution:\n", 1)[0]
            tagged = "".join(f"<chunk>{c}</chunk>" for c in split_step_markers(solution))
            if self.sloppy:
                tagged = tagged.replace("=", "==", 1)
            out.append([Completion(tagged, len(tagged.split()))])
        return out

    def close(self) -> None:
        pass


def test_llm_segmentation_accepts_only_exact_results() -> None:
    text = "Step 1: 2 + 3 = 5.\n\nStep 2: 5 * 2 = 10.\nThe final answer is \\boxed{10}."
    good = segment_with_model([text], StandInSegmenter())[0]
    assert good.method == "llm" and "".join(good.chunks) == text and len(good.chunks) == 2
    bad = segment_with_model([text], StandInSegmenter(sloppy=True))[0]
    assert bad.method == "llm-fallback:blank-lines" and "".join(bad.chunks) == text


def test_boundaries() -> None:
    assert boundaries("<chunk>ab</chunk>\n<chunk>cd</chunk>", "ab\ncd") == [0, 3]
    assert boundaries("<chunk>ab</chunk><chunk>cX</chunk>", "abcd") is None
    assert "{text}" in SEGMENT_PROMPT


def test_generate_with_llm_segmentation_and_stats_view(sqlite: Database, tmp_path: Path) -> None:
    _problems(sqlite, tmp_path, n=5)
    report = generate_trajectories(
        sqlite,
        "gen",
        make_backend("synthetic"),
        samples=2,
        template=load_template("synthetic"),
        params=SamplingParams(),
        segmentation="llm",
        segmenter=StandInSegmenter(),
    )
    assert report.segmentation == {"llm": 10}
    with sqlite.engine.connect() as conn:
        rows = conn.execute(
            text("SELECT segmentation, trajectories, chunks, chunks_per_trajectory FROM segmentation_stats")
        ).all()
    assert [(r[0], r[1]) for r in rows] == [("llm", 10)] and rows[0][3] == rows[0][2] / 10


def test_templates() -> None:
    assert render(TEMPLATES["chunk"], "What is {x}?").endswith("Problem: What is {x}?")
    assert "\\boxed{}" in render(TEMPLATES["step"], "q")
    with pytest.raises(ConfigError):
        load_template("nope")
    with pytest.raises(ConfigError):
        load_template(None, Path("/nonexistent/template.txt"))


def test_resegment_touches_only_trajectories_without_rollouts(sqlite: Database, tmp_path: Path) -> None:
    from stepq.workers.data.policy_sampling import resegment_set
    from stepq.workers.data.synthetic_set import synth_set
    from stepq.workers.jobqueue.runtime import WorkerOptions
    from stepq.workers.labelling.rollout_handler import run_work_item

    synth_set(sqlite, "r", problems=6, seed=3)
    with sqlite.session() as s:
        first = queries.set_trajectory_ids(s, queries.get_set(s, "r").id)[0]
        s.execute(text("UPDATE problem_sets SET rollouts_per_prefix = 1"))
        work_id = s.execute(
            RolloutWork.__table__.insert()
            .values(
                trajectory_id=first,
                problem_set_id=queries.get_set(s, "r").id,
                target_m=1,
                state="pending",
                attempts=0,
                enqueue_count=0,
            )
            .returning(RolloutWork.__table__.c.id)
        ).scalar_one()
    assert run_work_item(worker_runtime(sqlite, WorkerOptions(name="t")), work_id).status == "done"
    # synthetic chunks carry their truth: re-cut only with the old chunks written out first
    report = resegment_set(sqlite, "r", "llm", segmenter=StandInSegmenter(), export_old=tmp_path / "old.jsonl")
    assert (report.resegmented, report.skipped_annotated, report.exported) == (5, 1, 5)
    assert report.segmentation == {"llm": 5}
    with sqlite.session() as s:
        for t in s.scalars(select(Trajectory)):
            chunks = queries.trajectory_chunks(s, t.id)
            assert "".join(c.text for c in chunks) == t.text and len(chunks) == t.n_chunks
            assert t.segmentation == ("step-markers" if t.id == first else "llm")


def test_resegment_leaves_a_trajectory_annotated_without_rollouts(sqlite: Database, tmp_path: Path) -> None:
    """The adaptive budget labels a right trajectory from its own outcome, with no rollout:
    it is annotated all the same, and its chunks and labels must stay."""
    from stepq.workers.data.policy_sampling import resegment_set

    annotated_set(sqlite, "a", m=8, problems=12, seed=3, budget="adaptive", worker="t", batch_rollouts=128)
    with sqlite.engine.connect() as conn:
        bare = conn.execute(
            text(
                "SELECT count(*) FROM rollout_work w WHERE w.state = 'done' AND NOT EXISTS "
                "(SELECT 1 FROM rollouts r WHERE r.trajectory_id = w.trajectory_id)"
            )
        ).scalar_one()
        labels_before = conn.execute(text("SELECT count(*) FROM chunk_labels")).scalar_one()
    assert bare >= 1, "some right trajectory was finished with zero rollouts"
    report = resegment_set(sqlite, "a", "llm", segmenter=StandInSegmenter(), export_old=tmp_path / "old.jsonl")
    assert (report.resegmented, report.skipped_annotated) == (0, 12)
    with sqlite.engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM chunk_labels")).scalar_one() == labels_before


def test_a_set_planned_while_the_segmenter_runs_keeps_its_chunks(any_db: Database, tmp_path: Path) -> None:
    """The eligibility check sits in the transaction that replaces the chunks: a set planned
    for annotation while the (slow) segmenting model ran is left as its work was planned."""
    from stepq.workers.annotation_plans import configure_annotation
    from stepq.workers.data.policy_sampling import resegment_set
    from stepq.workers.data.synthetic_set import synth_set

    synth_set(any_db, "race", problems=4, seed=3)

    class PlansMidway(StandInSegmenter):
        """Annotation is planned while this segmenter is still answering."""

        def generate(self, requests: Sequence[GenerationRequest], params: SamplingParams) -> list[list[Completion]]:
            configure_annotation(any_db, "race", 2)
            return super().generate(requests, params)

    report = resegment_set(any_db, "race", "llm", segmenter=PlansMidway(), export_old=tmp_path / "old.jsonl")
    assert (report.resegmented, report.skipped_annotated) == (0, 4)
    with any_db.session() as s:
        assert {t.segmentation for t in s.scalars(select(Trajectory))} == {"step-markers"}
