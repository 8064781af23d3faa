"""The mistakes operators make: each gets one line, a documented exit code, and changes nothing."""

from __future__ import annotations

import sqlite3
import subprocess
import time
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

from stepq.models import Database, RolloutWork, queries
from stepq.workers.annotation_plans import configure_annotation
from stepq.workers.data.synthetic_set import synth_set
from stepq.workers.jobqueue.dispatcher import Dispatcher
from tests.helpers import DATA, PG_SERVER, clean_env, outlets, run_stepq, table_counts


def _stepq(
    tmp: Path, *args: str, env: dict[str, str] | None = None, timeout: int = 120
) -> subprocess.CompletedProcess[str]:
    settings = {"STEPQ_DATABASE_URL": f"sqlite:///{tmp / 'stepq.db'}", **(env or {})}
    return run_stepq(*args, env=clean_env(**settings), cwd=tmp, timeout=timeout)


def _one_line(proc: subprocess.CompletedProcess[str]) -> str:
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("stepq: error: "), proc.stderr
    return lines[0]


def _db(tmp: Path) -> Database:
    return Database(f"sqlite:///{tmp / 'stepq.db'}")


def test_annotating_a_set_without_trajectories_says_how_to_get_them(tmp_path: Path) -> None:
    assert _stepq(tmp_path, "ingest", str(DATA / "math500_sample.jsonl"), "--set", "m").returncode == 0
    before = table_counts(_db(tmp_path))
    proc = _stepq(tmp_path, "annotate", "--set", "m", "--rollouts", "4")
    assert proc.returncode == 4
    line = _one_line(proc)
    assert "no trajectories" in line and "stepq generate --set m" in line and "--steps" in line
    assert table_counts(_db(tmp_path)) == before
    with _db(tmp_path).session() as s:
        assert queries.get_set(s, "m").rollouts_per_prefix == 0, "nothing was stored"


@pytest.mark.parametrize(
    ("backend", "missing"), [("openai", "--base-url and --model"), ("vllm", "--model"), ("hf", "--model")]
)
def test_a_backend_without_its_model_is_refused(tmp_path: Path, backend: str, missing: str) -> None:
    assert _stepq(tmp_path, "synth", "--set", "s", "--problems", "2").returncode == 0
    proc = _stepq(tmp_path, "annotate", "--set", "s", "--rollouts", "4", "--backend", backend)
    assert proc.returncode == 2 and f"the {backend} backend needs {missing}" in _one_line(proc)
    with _db(tmp_path).session() as s:
        pset = queries.get_set(s, "s")
        assert (pset.backend, pset.rollouts_per_prefix) == ("synthetic", 0)
    proc = _stepq(tmp_path, "generate", "--set", "s", "--samples", "1", "--backend", backend)
    assert proc.returncode == 2 and missing in _one_line(proc)


def test_the_synthetic_backend_on_real_problems_is_refused_before_sampling(tmp_path: Path) -> None:
    assert _stepq(tmp_path, "ingest", str(DATA / "gsm8k_sample.jsonl"), "--set", "g").returncode == 0
    before = table_counts(_db(tmp_path))
    proc = _stepq(tmp_path, "generate", "--set", "g", "--samples", "2")
    assert proc.returncode == 2 and "synthetic backend cannot continue" in _one_line(proc)
    assert table_counts(_db(tmp_path)) == before


@pytest.mark.parametrize("url", ["foo://host:1/0", "redis//127.0.0.1:6379/0", "127.0.0.1:6379"])
def test_a_malformed_broker_url_is_refused_at_start(tmp_path: Path, url: str) -> None:
    for command in (["worker"], ["dispatch", "--once"]):
        proc = _stepq(tmp_path, *command, env={"STEPQ_BROKER_URL": url})
        assert proc.returncode == 2 and "is not a broker URL" in _one_line(proc), proc.stderr


def test_an_unreachable_broker_gives_up_after_a_bounded_wait(tmp_path: Path) -> None:
    env = {"STEPQ_BROKER_URL": "redis://127.0.0.1:1/0", "STEPQ_BROKER_WAIT_S": "2"}
    assert _stepq(tmp_path, "db", "upgrade").returncode == 0
    for command in (["worker"], ["dispatch", "--once"]):
        started = time.monotonic()
        proc = _stepq(tmp_path, *command, env=env, timeout=60)
        assert proc.returncode == 6, proc.stderr
        assert "cannot reach the broker" in proc.stderr and "gave up after 2 s" in proc.stderr
        assert time.monotonic() - started < 30
    # a longer wait is not silent: each failed try that another follows is logged
    proc = _stepq(tmp_path, "dispatch", "--once", env={**env, "STEPQ_BROKER_WAIT_S": "6"}, timeout=60)
    assert proc.returncode == 6 and "unreachable (try 1:" in proc.stderr and "trying again for" in proc.stderr
    assert "broker redis://127.0.0.1:1/0 unreachable" in proc.stderr, "no password shown where none was set"


@pytest.mark.parametrize("command", [("status",), ("db", "upgrade")])
def test_a_database_that_does_not_exist_says_how_to_create_it(tmp_path: Path, command: tuple[str, ...]) -> None:
    url = make_url(PG_SERVER).set(database="stepq_no_such_database").render_as_string(hide_password=False)
    proc = _stepq(tmp_path, *command, env={"STEPQ_DATABASE_URL": url})
    assert proc.returncode == 5
    line = _one_line(proc)
    assert "database 'stepq_no_such_database' does not exist" in line and "createdb stepq_no_such_database" in line
    assert "not migrated" not in line


@pytest.mark.parametrize("command", [("status",), ("db", "upgrade")])
def test_a_user_that_does_not_exist_is_named_not_taken_for_a_missing_table(
    tmp_path: Path, command: tuple[str, ...]
) -> None:
    url = make_url(PG_SERVER).set(username="stepq_no_such_user").render_as_string(hide_password=False)
    proc = _stepq(tmp_path, *command, env={"STEPQ_DATABASE_URL": url})
    assert proc.returncode == 5
    line = _one_line(proc)
    assert "user 'stepq_no_such_user' does not exist" in line and "createuser stepq_no_such_user" in line
    assert "not migrated" not in line and "db upgrade" not in line


def test_synth_onto_a_set_of_another_seed_is_refused(tmp_path: Path) -> None:
    assert _stepq(tmp_path, "synth", "--set", "s", "--problems", "3", "--seed", "1").returncode == 0
    before = table_counts(_db(tmp_path))
    proc = _stepq(tmp_path, "synth", "--set", "s", "--problems", "5", "--seed", "2")
    assert proc.returncode == 2 and "seed 1" in _one_line(proc) and "seed 2" in _one_line(proc)
    assert table_counts(_db(tmp_path)) == before
    assert _stepq(tmp_path, "synth", "--set", "s", "--problems", "5", "--seed", "1").returncode == 0, "growing is fine"


def test_run_on_a_set_that_does_not_exist_is_refused_not_created(tmp_path: Path) -> None:
    """Only the quick start's bare ``stepq run`` makes its demo set: a typo'd set name is an error
    naming the sets there are, and creates nothing; ``--synthetic N`` asks for a new set."""
    assert _stepq(tmp_path, "synth", "--set", "tour", "--problems", "2").returncode == 0
    before = table_counts(_db(tmp_path))
    proc = _stepq(tmp_path, "run", "--set", "tuor")
    assert proc.returncode == 4
    assert "no problem set named 'tuor'" in _one_line(proc) and "'tour'" in _one_line(proc)
    assert table_counts(_db(tmp_path)) == before
    made = _stepq(tmp_path, "run", "--set", "fresh", "--synthetic", "2", "--rollouts", "1")
    assert made.returncode == 0 and "created synthetic set 'fresh': 2 problems" in made.stdout


@pytest.mark.parametrize(
    ("flags", "field"),
    [
        (("--rollouts", "100000000"), "rollouts per prefix: 100000000 is not between 1 and 4096"),
        (("--rollouts", "4", "--temperature", "nan"), "temperature: nan is not a finite number"),
        (("--rollouts", "4", "--temperature", "-1"), "temperature: -1.0 is not a finite number of 0 or more"),
        (("--rollouts", "4", "--top-p", "7"), "top_p: 7.0 is not in (0, 1]"),
        (("--rollouts", "4", "--max-tokens", "0"), "max_tokens: 0 is not a whole number"),
    ],
)
def test_sampling_settings_out_of_range_are_refused_naming_the_field(
    tmp_path: Path, flags: tuple[str, ...], field: str
) -> None:
    assert _stepq(tmp_path, "synth", "--set", "s", "--problems", "2").returncode == 0
    before = table_counts(_db(tmp_path))
    proc = _stepq(tmp_path, "annotate", "--set", "s", *flags)
    assert proc.returncode == 2 and field in _one_line(proc)
    assert table_counts(_db(tmp_path)) == before


def test_a_worker_log_level_that_does_not_exist_is_a_usage_error(tmp_path: Path) -> None:
    proc = _stepq(tmp_path, "worker", "--loglevel", "bogus")
    assert proc.returncode == 2 and "'bogus' is not one of" in proc.stderr


@pytest.mark.parametrize(
    ("name", "reason"),
    [("p,q", "holds a comma"), (" p", "starts or ends with white space"), ("   ", "is empty"), ("a\tb", "control")],
)
def test_a_set_name_that_cannot_be_addressed_as_typed_is_refused_at_creation(
    tmp_path: Path, name: str, reason: str
) -> None:
    assert _stepq(tmp_path, "db", "upgrade").returncode == 0
    before = table_counts(_db(tmp_path))
    for command in (
        ("synth", "--set", name, "--problems", "2"),
        ("ingest", str(DATA / "math500_sample.jsonl"), "--set", name),
    ):
        proc = _stepq(tmp_path, *command)
        assert proc.returncode == 2 and reason in _one_line(proc), command
    assert table_counts(_db(tmp_path)) == before
    assert _stepq(tmp_path, "synth", "--set", "p q ü", "--problems", "1").returncode == 0, (
        "spaces inside, unicode: fine"
    )


def test_a_worker_or_dispatcher_without_a_named_database_makes_no_stray_file(tmp_path: Path) -> None:
    """Left unset, the database would default to a SQLite file in the working directory that no
    other process sees, and the fleet's broker would be served from it."""
    env = clean_env(STEPQ_BROKER_URL="redis://127.0.0.1:1/0", STEPQ_BROKER_WAIT_S="1")
    for command in (("worker",), ("dispatch", "--once")):
        proc = run_stepq(*command, env=env, cwd=tmp_path, timeout=60)
        assert proc.returncode == 2 and "STEPQ_DATABASE_URL is not set" in _one_line(proc)
    assert not (tmp_path / "stepq.db").exists()


def test_synth_draws_the_numbers_asked_for(tmp_path: Path) -> None:
    import re

    assert _stepq(tmp_path, "synth", "--set", "s", "--problems", "12", "--numbers", "small").returncode == 0
    assert _stepq(tmp_path, "synth", "--set", "d", "--problems", "12").returncode == 0
    with _db(tmp_path).engine.connect() as conn:
        rows = conn.execute(
            text("SELECT s.name, p.question FROM problems p JOIN problem_sets s ON s.id = p.problem_set_id")
        ).all()
    small = [q for name, q in rows if name == "s"]
    default = [q for name, q in rows if name == "d"]
    assert len(small) == len(default) == 12
    for q in small:
        assert 30 <= int(re.match(r"Start with (\d+)\.", q).group(1)) <= 60 and "Multiply" not in q  # type: ignore[union-attr]
        assert all(1 <= int(x) <= 9 for x in re.findall(r"(?:Add|Subtract) (\d+)\.", q))
    assert any("Multiply" in q or int(re.match(r"Start with (\d+)\.", q).group(1)) < 30 for q in default)  # type: ignore[union-attr]
    proc = _stepq(tmp_path, "synth", "--set", "s", "--problems", "13")
    assert proc.returncode == 2 and "same settings" in _one_line(proc), "a set keeps its numbers"


def test_synth_takes_error_kinds_and_refuses_unknown_ones(tmp_path: Path) -> None:
    kinds = ("--error-kind", "carry=2", "--error-kind", "operand")
    ok = _stepq(tmp_path, "synth", "--set", "k", "--problems", "3", *kinds)
    assert ok.returncode == 0, ok.stderr
    with _db(tmp_path).session() as s:
        assert queries.get_set(s, "k").backend_config["error_kinds"] == {"carry": 2.0, "operand": 1.0}
    for bad, said in (("typo", "the kind is one of result, operand, operation, carry"), ("carry=-1", "positive")):
        proc = _stepq(tmp_path, "synth", "--set", "b", "--problems", "3", "--error-kind", bad)
        assert proc.returncode == 2 and said in _one_line(proc)
    with _db(tmp_path).engine.connect() as conn:
        assert conn.execute(text("SELECT name FROM problem_sets")).scalars().all() == ["k"], "nothing was stored"


def test_run_while_a_dispatcher_runs_is_busy_and_creates_nothing(tmp_path: Path) -> None:
    assert _stepq(tmp_path, "db", "upgrade").returncode == 0
    db = _db(tmp_path)
    holder = Dispatcher(db, outlets(lambda ids: None), name="the-other-dispatcher")
    assert holder.acquire()
    proc = _stepq(tmp_path, "run", "--set", "d", "--synthetic", "3")
    assert proc.returncode == 75 and "the-other-dispatcher" in _one_line(proc)
    with db.engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM problem_sets")).scalar_one() == 0


def test_a_second_run_on_the_same_file_is_told_another_run_holds_it(tmp_path: Path) -> None:
    """Two 'stepq run' on one SQLite file: the second was told "a dispatcher is running"."""
    assert _stepq(tmp_path, "db", "upgrade").returncode == 0
    first = Dispatcher(_db(tmp_path), outlets(lambda ids: None), name="embedded:laptop-1234")
    assert first.acquire()
    proc = _stepq(tmp_path, "run", "--set", "d", "--synthetic", "3")
    line = _one_line(proc)
    assert proc.returncode == 75 and "another 'stepq run' (laptop-1234) is working on" in line, line
    assert "dispatcher" not in line


def test_a_postgres_url_as_hosted_databases_give_it_is_postgresql(tmp_path: Path, pg_url: str) -> None:
    url = pg_url.replace("postgresql+psycopg://", "postgres://").replace("postgresql://", "postgres://")
    assert url.startswith("postgres://")
    proc = _stepq(tmp_path, "status", env={"STEPQ_DATABASE_URL": url})
    assert proc.returncode == 0, proc.stderr


def test_flower_refuses_to_listen_beyond_loopback_without_auth(tmp_path: Path) -> None:
    proc = _stepq(tmp_path, "flower", "--address", "0.0.0.0")
    assert proc.returncode == 2 and "STEPQ_FLOWER_BASIC_AUTH" in _one_line(proc)
    shown = _stepq(tmp_path, "flower", "--address", "0.0.0.0", "--basic-auth", f"admin:{SECRET}")
    assert shown.returncode == 2 and "every user's ps shows it" in _one_line(shown)
    assert SECRET not in shown.stdout + shown.stderr
    (tmp_path / "auth").write_text("no-colon\n")
    bad = _stepq(tmp_path, "flower", "--address", "0.0.0.0", "--basic-auth-file", str(tmp_path / "auth"))
    assert bad.returncode == 2 and "expected one line USER:PASSWORD" in _one_line(bad)


def test_an_unreachable_openai_server_fails_fast() -> None:
    import socket

    from stepq.models.errors import GenerationError
    from stepq.workers.backends import GenerationRequest, SamplingParams
    from stepq.workers.backends.openai_server import OpenAICompletionsBackend

    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    backend = OpenAICompletionsBackend(f"http://127.0.0.1:{port}/v1", "m", max_retries=6, backoff_s=1.0)
    started = time.monotonic()
    with pytest.raises(GenerationError, match="connection refused") as err:
        backend.generate([GenerationRequest("x", (1, 2))], SamplingParams())
    assert time.monotonic() - started < 2, "no backoff on a refused connection"
    assert not err.value.permanent, "the queue retries it later"
    backend.close()


def test_pause_resume_and_delete_a_set(any_db: Database) -> None:
    synth_set(any_db, "keep", problems=3, seed=1)
    synth_set(any_db, "stop", problems=3, seed=2)
    configure_annotation(any_db, "keep", 2)
    configure_annotation(any_db, "stop", 2)
    published: list[int] = []
    with any_db.session() as s:
        assert queries.pause_set(s, "stop", True)
        stop_items = set(queries.set_trajectory_ids(s, queries.get_set(s, "stop").id))
    d = Dispatcher(any_db, outlets(published.extend))
    d.options = type(d.options)(messages_per_worker=None)
    d.cycle()
    with any_db.session() as s:
        published_trajectories = {s.get(RolloutWork, i).trajectory_id for i in published}  # type: ignore[union-attr]
    assert published_trajectories and not (published_trajectories & stop_items), "a paused set is not dispatched"
    with any_db.session() as s:
        assert queries.pause_set(s, "stop", False)
    d.cycle()
    assert len(published) == 6
    with any_db.session() as s:
        gone = queries.delete_set(s, "stop")
    assert gone["problems"] == 3 and gone["trajectories"] == 3
    with any_db.session() as s:
        assert [r["problem_set"] for r in queries.progress(s)] == ["keep"]
    with any_db.engine.connect() as conn:
        left = conn.execute(text("SELECT count(*) FROM trajectories")).scalar_one()
        counters = conn.execute(text("SELECT count(DISTINCT problem_set_id) FROM set_counters")).scalar_one()
    assert left == 3
    if any_db.engine.dialect.name == "postgresql":
        assert counters == 1, "the deleted set's counters went with it"


def test_set_commands(tmp_path: Path) -> None:
    assert _stepq(tmp_path, "synth", "--set", "s", "--problems", "2").returncode == 0
    assert "paused" in _stepq(tmp_path, "set", "pause", "s").stdout
    assert "resumed" in _stepq(tmp_path, "set", "resume", "s").stdout
    proc = _stepq(tmp_path, "set", "delete", "s")
    assert proc.returncode == 2 and "--yes" in _one_line(proc)
    assert _stepq(tmp_path, "set", "delete", "nope", "--yes").returncode == 4
    done = _stepq(tmp_path, "set", "delete", "s", "--yes")
    assert done.returncode == 0 and "2 problems" in done.stdout
    assert _stepq(tmp_path, "status").returncode == 0


SECRET = "s3cret-Pw0rd"


@pytest.mark.parametrize(
    "args, settings",
    [
        (("db", "upgrade"), {"STEPQ_DATABASE_URL": f"postgresql://stepq:{SECRET}@127.0.0.1:1/stepq"}),
        (("status",), {"STEPQ_DATABASE_URL": f"postgresql://stepq:{SECRET}@127.0.0.1:1/stepq"}),
        (("status",), {"STEPQ_DATABASE_URL": f"mysql://stepq:{SECRET}@127.0.0.1:1/stepq"}),
        (("dispatch", "--once"), {"STEPQ_BROKER_URL": f"redis://:{SECRET}@127.0.0.1:1/0"}),
        (("dispatch", "--once"), {"STEPQ_BROKER_URL": f"redis//:{SECRET}@127.0.0.1:1/0"}),
        (("worker",), {"STEPQ_BROKER_URL": f"redis://:{SECRET}@127.0.0.1:1/0"}),
        (("worker",), {"STEPQ_DATABASE_URL": f"postgresql://stepq:{SECRET}@127.0.0.1:1/stepq"}),
        (("status",), {"STEPQ_DATABASE_URL": f"postgresql://stepq@127.0.0.1:1/stepq?password={SECRET}"}),
        (("status",), {"STEPQ_DATABASE_URL": f"postgresql://127.0.0.1:1/stepq?user=u&PASSWORD={SECRET}&x=1"}),
        (("dispatch", "--once"), {"STEPQ_BROKER_URL": f"redis://127.0.0.1:1/0?password={SECRET}"}),
    ],
)
def test_no_password_in_any_output(tmp_path: Path, args: tuple[str, ...], settings: dict[str, str]) -> None:
    """A command that fails on a URL with a password says what failed, never the password."""
    env = clean_env(**{"STEPQ_BROKER_WAIT_S": "1", "STEPQ_DATABASE_URL": f"sqlite:///{tmp_path / 's.db'}"})
    assert run_stepq("db", "upgrade", env=env, cwd=tmp_path).returncode == 0
    done = run_stepq(*args, env={**env, **settings}, cwd=tmp_path, timeout=120)
    assert done.returncode != 0
    assert SECRET not in done.stdout + done.stderr, done.stdout + done.stderr
    assert "***" in done.stderr or "127.0.0.1" in done.stderr or "not a" in done.stderr, done.stderr


def test_a_password_given_as_a_query_parameter_is_masked_like_one_in_the_userinfo() -> None:
    from stepq.models.errors import masked

    for url in (
        f"postgresql://u@h/db?password={SECRET}",
        f"postgresql://u@h/db?sslmode=require&password={SECRET}&connect_timeout=5",
        f"redis://h:6379/0?Password={SECRET}",
        f"http://h/v1?api_key={SECRET}",
    ):
        shown = masked(f"cannot reach {url}: refused")
        assert SECRET not in shown and "=***" in shown, shown
    assert masked("postgresql://u@h/db?sslmode=require") == "postgresql://u@h/db?sslmode=require"
    # a raw @ in the password: everything up to the userinfo's last @ is the secret
    assert masked(f"postgresql://stepq:{SECRET}@x@db:5432/stepq down") == "postgresql://stepq:***@db:5432/stepq down"
    assert masked(f"redis://:a@{SECRET}@h:6379/0 and //u:{SECRET}@h2/x") == "redis://:***@h:6379/0 and //u:***@h2/x"
    assert masked("http://h:80/a@b redis://h:6379/0") == "http://h:80/a@b redis://h:6379/0", "no password, no change"


@pytest.mark.parametrize(
    "secret_flags",
    [
        ("--base-url", f"http://user:{SECRET}@127.0.0.1:1/v1"),
        ("--base-url", "http://127.0.0.1:1/v1", "--backend-option", f"api_key={SECRET}"),
        ("--base-url", "http://127.0.0.1:1/v1", "--backend-option", f"auth_token={SECRET}"),
    ],
)
def test_a_backend_secret_is_never_stored_in_the_database(tmp_path: Path, secret_flags: tuple[str, ...]) -> None:
    """A set's backend config is a row (shown by status, exports, SQL): a password in the server's
    URL or a key among its options is refused before anything is stored, without being shown."""
    assert _stepq(tmp_path, "synth", "--set", "o", "--problems", "1").returncode == 0
    before = table_counts(_db(tmp_path))
    annotate = ("annotate", "--set", "o", "--rollouts", "1", "--backend", "openai", "--model", "m", *secret_flags)
    proc = _stepq(tmp_path, *annotate)
    assert proc.returncode == 2 and "stored in the database in clear" in _one_line(proc)
    assert "STEPQ_OPENAI_API_KEY" in proc.stderr and SECRET not in proc.stdout + proc.stderr
    assert table_counts(_db(tmp_path)) == before
    with sqlite3.connect(tmp_path / "stepq.db") as conn:
        assert SECRET not in str(conn.execute("SELECT backend, backend_config FROM problem_sets").fetchall())


def test_a_changed_sampling_setting_is_refused_or_resampled_explicitly(tmp_path: Path) -> None:
    """After a run, raising the temperature is refused (naming the change and both ways
    forward); with --resample the set is sampled again: every rollout of the new generator,
    the old ones gone from the Q-values and labels."""
    env = clean_env(STEPQ_DATABASE_URL=f"sqlite:///{tmp_path / 's.db'}")

    def stepq(*args: str) -> subprocess.CompletedProcess[str]:
        return run_stepq(*args, env=env, cwd=tmp_path, timeout=300)

    assert stepq("run", "--set", "demo", "--synthetic", "8", "--rollouts", "4").returncode == 0
    db = Database(f"sqlite:///{tmp_path / 's.db'}")

    def generators() -> dict[str, int]:
        with db.engine.connect() as conn:
            return dict(conn.execute(text("SELECT generator, count(*) FROM rollouts GROUP BY generator")).all())

    before, counts = generators(), table_counts(db)
    assert len(before) == 1 and "[t=1," in next(iter(before)), before
    for change in (("--temperature", "0.7"), ("--max-tokens", "64")):
        refused = stepq("annotate", "--set", "demo", "--rollouts", "4", *change)
        assert refused.returncode == 2, refused.stderr
        name = change[0].removeprefix("--").replace("-", "_")
        assert f"{name} " in refused.stderr and "--resample" in refused.stderr and "new set" in refused.stderr
        assert table_counts(db) == counts and generators() == before, "a refused command changes nothing"
    resampled = stepq("annotate", "--set", "demo", "--rollouts", "4", "--temperature", "0.7", "--resample")
    assert resampled.returncode == 0, resampled.stderr
    assert generators() == {}, "the old generator's rollouts are out of the Q-values and labels"
    ran = stepq("run", "--set", "demo", "--rollouts", "4")
    assert ran.returncode == 0, ran.stderr
    after = generators()
    assert len(after) == 1 and "[t=0.7," in next(iter(after)) and sum(after.values()) == sum(before.values())
    with db.engine.connect() as conn:
        labelled = conn.execute(text("SELECT count(*) FROM chunk_labels")).scalar_one()
        assert labelled == counts["chunk_labels"], "every chunk labelled again, from the new rollouts"


def test_a_run_that_ends_with_failed_items_exits_non_zero(tmp_path: Path) -> None:
    """A sampling change slipped past the guard (written to the database directly) makes every
    item fail on the generator check: the run says so and exits 7, not 0."""
    env = clean_env(STEPQ_DATABASE_URL=f"sqlite:///{tmp_path / 's.db'}", STEPQ_MAX_ATTEMPTS="1")
    assert (
        run_stepq("run", "--set", "demo", "--synthetic", "4", "--rollouts", "2", env=env, cwd=tmp_path).returncode == 0
    )
    db = Database(f"sqlite:///{tmp_path / 's.db'}")
    with db.engine.begin() as conn:
        conn.execute(text("UPDATE problem_sets SET sampling = '{\"temperature\": 0.5}'"))
        conn.execute(text("UPDATE problem_sets SET rollouts_per_prefix = 3"))
    ran = run_stepq("run", "--set", "demo", "--rollouts", "3", env=env, cwd=tmp_path, timeout=300)
    assert ran.returncode == 7, (ran.stdout, ran.stderr)
    assert "work items of set 'demo' failed" in ran.stderr and "stepq retry --set demo" in ran.stderr


def test_a_worker_refuses_to_start_without_a_working_math_verify(tmp_path: Path) -> None:
    """A broken math-verify would grade every answer only it can check as wrong, silently: the
    worker's start-up self-test refuses (exit 2) before any work is taken."""
    broken = tmp_path / "broken"
    (broken / "math_verify").mkdir(parents=True)
    (broken / "math_verify" / "__init__.py").write_text("raise ImportError('a broken install')\n")
    assert _stepq(tmp_path, "db", "upgrade").returncode == 0
    env = {"PYTHONPATH": str(broken), "STEPQ_BROKER_URL": "redis://127.0.0.1:1/0", "STEPQ_BROKER_WAIT_S": "1"}
    proc = _stepq(tmp_path, "worker", env=env, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "math-verify does not grade here" in proc.stderr


def test_a_command_whose_extra_is_missing_names_its_install(tmp_path: Path) -> None:
    """On the base install (no torch, transformers, TRL, datasets), each command names the
    smallest extra that serves it (training: train; a PRM judge or the hf backend: hf; a
    dataset ingest: datasets), with the config error's exit code, never an internal error."""
    import sys

    assert _stepq(tmp_path, "synth", "--set", "s", "--problems", "3").returncode == 0
    blocked = "import sys\nfor m in ('torch', 'transformers', 'trl', 'datasets', 'accelerate'): sys.modules[m] = None\n"
    pb = str(DATA / "processbench_gsm8k_sample.json")
    for args, extra in (
        (["train", "--method", "prm", "--set", "s", "--pass-rate", "off", "--model", "x", "--output", "out"], "train"),
        (["eval", "processbench", "--data", pb, "--judge", "prm", "--model", "x"], "hf"),
        (["ingest", "nobody/a-dataset", "--hf", "--set", "d"], "datasets"),
    ):
        code = blocked + f"from stepq.cli import main\nmain({args!r})\n"
        env = clean_env(STEPQ_DATABASE_URL=f"sqlite:///{tmp_path / 'stepq.db'}")
        proc = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True)
        assert proc.returncode == 2, proc.stderr
        assert f"which is not installed: pip install 'stepq[{extra}]'" in proc.stderr, (args, proc.stderr)
        assert "internal" not in proc.stderr


def test_a_missing_module_no_extra_provides_is_an_internal_error() -> None:
    from stepq.commands.base import missing_extra

    assert missing_extra(ModuleNotFoundError("no", name="torch.nn")) == "pip install 'stepq[hf]'"
    assert missing_extra(ModuleNotFoundError("no", name="torch.nn"), "train") == "pip install 'stepq[train]'"
    assert missing_extra(ModuleNotFoundError("no", name="datasets")) == "pip install 'stepq[datasets]'"
    assert missing_extra(ModuleNotFoundError("no", name="trl")) == "pip install 'stepq[train]'"
    assert missing_extra(ModuleNotFoundError("no", name="vllm")) == "pip install 'stepq[vllm]'"
    assert missing_extra(ModuleNotFoundError("no", name="sqlalchemy")) is None, "a broken base install is a bug"


def test_a_worker_whose_backend_is_not_installed_refuses_to_start(tmp_path: Path) -> None:
    """`stepq worker --backend vllm` without vLLM said ready, took every task and failed each;
    it now exits 2 naming what to install before it reaches the broker (a dead one here)."""
    assert _stepq(tmp_path, "db", "upgrade").returncode == 0
    blocked = tmp_path / "site"
    blocked.mkdir()
    (blocked / "sitecustomize.py").write_text("import sys\nsys.modules['vllm'] = None\n")
    env = {"PYTHONPATH": str(blocked), "STEPQ_BROKER_URL": "redis://127.0.0.1:1/0", "STEPQ_BROKER_WAIT_S": "30"}
    started = time.monotonic()
    proc = _stepq(tmp_path, "worker", "--backend", "vllm", "--model", "/weights/policy", env=env, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "the vllm backend needs vllm, which is not installed here: pip install 'stepq[vllm]'" in proc.stderr
    assert time.monotonic() - started < 25, "refused before waiting for the broker"


def test_a_request_that_always_hangs_counts_its_attempts_and_gives_up(tmp_path: Path) -> None:
    """Each hang past STEPQ_GENERATE_TIMEOUT_S handed the item back without counting an attempt,
    so a request that always hangs the engine was retried for ever with nothing recorded.  Now
    each hang is an attempt with its error; after the retry policy's limit the item fails."""
    env = clean_env(
        STEPQ_DATABASE_URL=f"sqlite:///{tmp_path / 's.db'}",
        STEPQ_GENERATE_TIMEOUT_S="2",
        STEPQ_MAX_ATTEMPTS="2",
        STEPQ_RETRY_BACKOFF_S="0",
    )
    assert (
        run_stepq("synth", "--set", "h", "--problems", "1", "--latency-s", "60", env=env, cwd=tmp_path).returncode == 0
    )
    assert run_stepq("annotate", "--set", "h", "--rollouts", "1", env=env, cwd=tmp_path).returncode == 0
    db = Database(f"sqlite:///{tmp_path / 's.db'}")
    seen = []
    for _ in range(2):
        hung = run_stepq("run", "--set", "h", env=env, cwd=tmp_path, timeout=120)
        assert hung.returncode == 69, hung.stderr
        with db.engine.begin() as conn:
            seen.append(tuple(conn.execute(text("SELECT state, attempts, last_error FROM rollout_work")).one()))
            # the exited run's dispatcher lock would expire in 30 s; the next run need not wait
            conn.execute(text("UPDATE locks SET lease_expires_at = 0"))
    assert [(state, attempts) for state, attempts, _ in seen] == [("pending", 1), ("failed", 2)]
    assert all("did not return within 2 s" in (error or "") for _, _, error in seen)
    db.dispose()
