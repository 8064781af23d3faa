"""Status, dispatch and task costs at StepWiser's scale: do they grow with the database?

    python -m bench.ops.bench_scale [--sizes 1000000,10000000] [--repeat 5]

For each size, a fresh PostgreSQL database is seeded by COPY in StepWiser's shape (7
chunks per trajectory, 16 rollouts per prefix: 112 rollouts a trajectory, every one graded,
its Q-values and labels stored, its work item done), plus 2,000 pending trajectories that
have not been annotated yet; 1% of the work failed and 1% backing off after an error (what
status and metrics count), the first set paused (when there are two or more), and one pending step search per 10
trajectories (the dispatcher's other kind of work).  Triggers are off during the load and the counters are rebuilt
once (``stepq_recount()``), as an operator would after a bulk import.  Then it times:

- ``stepq status``: the report it prints (``stepq.status.collect``), warm;
- one dispatcher cycle that publishes a bound's worth of pending work (one live worker);
- one task's claim-and-write: claim a pending trajectory, generate its 112 rollouts with an
  instant backend (so only the queue's own cost is measured), grade, write them with
  Q-values, labels and "done".

Each is the median of ``--repeat`` runs.  Targets: each at 10M within 1.5x of its time at
1M, and status under 1 s at 10M.  It also reports the database's size on disk, the server's
``shared_buffers`` and the benchmark process's peak memory.  Needs a local PostgreSQL
(STEPQ_BENCH_PG_URL) and disk for the 10M database (~3 GB); ``--sizes 1000000,55000000`` is
StepWiser's whole data set (about 3.5M chunks, 55M rollouts).
"""

from __future__ import annotations

import argparse
import io
import resource
import statistics
import time
from collections.abc import Callable, Iterator, Sequence

from sqlalchemy import text

from bench.common import emit, scratch_pg
from stepq.assembly import worker_runtime
from stepq.models import Database, jobs, queries
from stepq.models.work import ROLLOUT_WORK
from stepq.status import collect
from stepq.workers.backends import Completion, GenerationRequest, SamplingParams
from stepq.workers.jobqueue.dispatcher import Dispatcher, DispatchOptions
from stepq.workers.jobqueue.job_kind import Outlet
from stepq.workers.jobqueue.runtime import WorkerOptions
from stepq.workers.kinds import ROLLOUTS, SEARCHES
from stepq.workers.labelling.rollout_handler import run_work_item

CHUNKS = 7
M = 16
PER_TRAJECTORY = CHUNKS * M
PENDING = 2000
PROBLEMS_PER_SET = 5000
TROUBLED = 100
"""1 in 100 trajectories' work failed, 1 in 100 backing off after a transient error."""
SEARCH_EVERY = 10
"""One pending step search per 10 trajectories (about 9,300 at 10M rollouts)."""


class Instant:
    """A backend that answers at once: the benchmark times the queue, not a model."""

    name = "instant"
    generator = "instant"

    def generate(self, requests: Sequence[GenerationRequest], params: SamplingParams) -> list[list[Completion]]:
        return [[Completion("so \\boxed{1}", 3) for _ in r.seeds] for r in requests]

    def close(self) -> None:
        return None


def _copy(db: Database, table: str, columns: str, rows: Iterator[str]) -> None:
    """COPY rows (tab-separated lines) into a table, 50,000 lines at a time."""
    raw = db.engine.raw_connection()
    try:
        cur = raw.cursor()
        with cur.copy(f"COPY {table} ({columns}) FROM STDIN") as copy:  # type: ignore[attr-defined]
            buf = io.StringIO()
            for i, line in enumerate(rows, 1):
                buf.write(line)
                if i % 50000 == 0:
                    copy.write(buf.getvalue())
                    buf = io.StringIO()
            copy.write(buf.getvalue())
        raw.commit()
    finally:
        raw.close()


def seed(db: Database, rollouts: int) -> int:
    """Load a database with about ``rollouts`` rollouts; returns the trajectory count."""
    done = rollouts // PER_TRAJECTORY
    total = done + PENDING
    n_sets = max(1, total // (PROBLEMS_PER_SET * 2) + 1)
    problems = (total + 1) // 2  # two trajectories a problem
    text_ = "".join(f"Step {k + 1}: 1 + 0 = 1.\n\n" for k in range(CHUNKS - 1)) + "So \\boxed{1}."
    chunk_texts = [f"Step {k + 1}: 1 + 0 = 1.\n\n" for k in range(CHUNKS - 1)] + ["So \\boxed{1}."]
    with db.engine.begin() as conn:
        for table in ("problems", "trajectories", "rollouts", "rollout_work", "chunk_labels"):
            conn.execute(text(f"ALTER TABLE {table} DISABLE TRIGGER USER"))
        for s in range(n_sets):
            conn.execute(
                text(
                    "INSERT INTO problem_sets (id, name, rollouts_per_prefix, label_rule, budget_policy, backend, "
                    "backend_config, sampling, seed, needs_planning) VALUES (:id, :n, 16, 'abs-q', 'exhaustive', "
                    "'synthetic', '{}', '{}', 0, false)"
                ),
                {"id": s + 1, "n": f"scale-{s}"},
            )
    _copy(
        db,
        "problems",
        "id, problem_set_id, external_id, question, reference_answer, meta",
        (f"{p + 1}\t{p % n_sets + 1}\tq{p}\tWhat is 1?\t1\t{{}}\n" for p in range(problems)),
    )
    _copy(
        db,
        "trajectories",
        "id, problem_id, source_key, prompt, text, final_answer, outcome, n_chunks, segmentation, generator",
        (
            f"{t + 1}\t{t // 2 + 1}\tk{t % 2}\tProblem: What is 1?\\nSolution:\\n\t{_esc(text_)}\t1\ttrue\t{CHUNKS}"
            "\tstep-markers\tinstant\n"
            for t in range(total)
        ),
    )
    _copy(
        db,
        "chunks",
        "trajectory_id, idx, text",
        (f"{t + 1}\t{k + 1}\t{_esc(chunk_texts[k])}\n" for t in range(total) for k in range(CHUNKS)),
    )
    _copy(
        db,
        "rollouts",
        "trajectory_id, prefix_len, sample_idx, seed, text, final_answer, reward, grade_method, tokens, generator, "
        "worker",
        (
            f"{t + 1}\t{k}\t{j}\t{j}\t\t1\t1\texact\t3\tinstant[t=1,p=1,max=8192]\tseed\n"
            for t in range(done)
            for k in range(CHUNKS)
            for j in range(M)
        ),
    )
    _copy(
        db,
        "q_values",
        "trajectory_id, prefix_len, n_samples, n_correct, q, source",
        (
            f"{t + 1}\t{k}\t{M if k < CHUNKS else 1}\t{M if k < CHUNKS else 1}\t1.0\t"
            f"{'rollouts' if k < CHUNKS else 'outcome'}\n"
            for t in range(done)
            for k in range(CHUNKS + 1)
        ),
    )
    _copy(
        db,
        "chunk_labels",
        "chunk_id, rule, positive, q_before, q_after",
        (f"{t * CHUNKS + k + 1}\tabs-q\ttrue\t1.0\t1.0\n" for t in range(done) for k in range(CHUNKS)),
    )
    _copy(
        db,
        "rollout_work",
        "trajectory_id, problem_set_id, target_m, state, attempts, enqueue_count, trajectory_is_sample, last_error, "
        "retry_at",
        (_work_row(t, done, n_sets) for t in range(total)),
    )
    searches = total // SEARCH_EVERY
    _copy(
        db,
        "step_searches",
        "name, problem_set_id, problem_id, prompt, width, max_turns, seed, judge_backend, judge_config, scoring, "
        "state, attempts, enqueue_count, rerun, updated_at",
        (
            f"scale\t{p % n_sets + 1}\t{p + 1}\tProblem: What is 1?\\nSolution:\\n\t6\t20\t0\tsynthetic-oracle"
            "\t{}\teach-verdict\tpending\t0\t0\tfalse\t0\n"
            for p in range(searches)
        ),
    )
    if n_sets > 1:  # the first set is paused: its pending work must not be published
        with db.engine.begin() as conn:
            conn.execute(text("UPDATE problem_sets SET paused = true WHERE id = 1"))
    with db.engine.begin() as conn:
        for table in ("problems", "trajectories", "rollouts", "rollout_work", "chunk_labels"):
            conn.execute(text(f"ALTER TABLE {table} ENABLE TRIGGER USER"))
        for table in ("problem_sets", "problems", "trajectories", "chunks", "q_values", "chunk_labels"):
            conn.execute(text(f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), (SELECT max(id) FROM {table}))"))
        conn.execute(
            text("SELECT setval(pg_get_serial_sequence('rollout_work', 'id'), (SELECT max(id) FROM rollout_work))")
        )
        conn.execute(text("SELECT setval(pg_get_serial_sequence('rollouts', 'id'), (SELECT max(id) FROM rollouts))"))
        conn.execute(text("SELECT stepq_recount()"))
    with db.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM ANALYZE"))
    return total


def _work_row(t: int, done: int, n_sets: int) -> str:
    """Done work, with 1 in TROUBLED failed and 1 in TROUBLED backing off after an error;
    the rest pending.  Trajectory t is of problem t // 2, of set (t // 2) % n_sets + 1."""
    state, error, retry_at = ("done" if t < done else "pending"), "\\N", "\\N"
    if t < done and t % TROUBLED == 0:
        state, error = "failed", "GenerationError: the engine refused"
    elif t < done and t % TROUBLED == 1:
        state, error, retry_at = "pending", "GenerationError: timed out", "4102444800"
    set_id = (t // 2) % n_sets + 1
    return f"{t + 1}\t{set_id}\t{M}\t{state}\t{int(t < done)}\t{int(t < done)}\tfalse\t{error}\t{retry_at}\n"


def _esc(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace("\t", "\\t")


def _median(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(rollouts: int, repeat: int) -> dict[str, float | int]:
    with scratch_pg() as url:
        db = Database(url)
        started = time.perf_counter()
        trajectories = seed(db, rollouts)
        load_s = time.perf_counter() - started
        with db.session() as s:
            stored = int(s.scalar(text("SELECT count(*) FROM rollouts")) or 0)
            chunks = int(s.scalar(text("SELECT count(*) FROM chunks")) or 0)
            disk = int(s.scalar(text("SELECT pg_database_size(current_database())")) or 0)
            shared_buffers = str(s.scalar(text("SHOW shared_buffers")))
            queries.heartbeat(s, "bench", hostname="h", pid=1, backend="instant", busy_items=0)
        status_s = _median(lambda: collect(db), repeat)
        published: list[int] = []
        outlets = [Outlet(ROLLOUTS, published.extend, 4), Outlet(SEARCHES, published.extend, 1)]
        dispatcher = Dispatcher(db, outlets, options=DispatchOptions())
        dispatcher.cycle()  # planning flags and first publish out of the way

        def one_cycle() -> None:
            with db.engine.begin() as conn:  # what workers do: take the queued items
                conn.execute(text("UPDATE rollout_work SET state = 'running' WHERE state = 'queued'"))
                conn.execute(text("UPDATE step_searches SET state = 'running' WHERE state = 'queued'"))
            dispatcher.cycle()

        cycle_s = _median(one_cycle, repeat)
        rt = worker_runtime(db, WorkerOptions(name="bench", batch_rollouts=PER_TRAJECTORY), backend=Instant())
        with db.session() as s:
            todo = jobs.pending_ids(s, ROLLOUT_WORK, repeat)
        task_times = []
        for work_id in todo:
            start = time.perf_counter()
            assert run_work_item(rt, work_id).status == "done"
            task_times.append(time.perf_counter() - start)
        db.dispose()
    return {
        "rollouts": stored,
        "chunks": chunks,
        "trajectories": trajectories,
        "load_s": round(load_s, 1),
        "database_gb": round(disk / 1e9, 2),
        "server_shared_buffers": shared_buffers,
        "bench_peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "status_ms": round(1000 * status_s, 2),
        "dispatch_cycle_ms": round(1000 * cycle_s, 2),
        "claim_and_write_ms": round(1000 * statistics.median(task_times), 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1000000,10000000")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    result: dict[str, object] = {}
    for size in sizes:
        result[str(size)] = figures = measure(size, args.repeat)
        print(size, figures, flush=True)
    if len(sizes) >= 2:
        small, large = result[str(sizes[0])], result[str(sizes[-1])]
        assert isinstance(small, dict) and isinstance(large, dict)
        result["ratio_largest_to_smallest"] = {
            k: round(large[k] / small[k], 2) for k in ("status_ms", "dispatch_cycle_ms", "claim_and_write_ms")
        }
    emit(result)


if __name__ == "__main__":
    main()
