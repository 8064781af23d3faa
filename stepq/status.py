"""What ``stepq status`` shows: progress per set, live rates and ETAs, troubles, workers.

Every figure comes from small reads (trigger-kept counters on PostgreSQL, the dispatcher's
progress samples, failed and backing-off items, live heartbeats), so it costs the same on a
run of a thousand rollouts or of fifty million, and ``--watch`` can refresh it every second.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from stepq.models import Database, epoch, jobs, queries
from stepq.models.work import ROLLOUT_WORK

RATE_WINDOW_S = 60.0
"""Rates are measured from the oldest progress sample this recent (the dispatcher writes them)."""
WORKER_LIVE_S = 60.0
"""A worker whose last heartbeat is older than this is not shown as live."""


def done_percent(done: int, planned: int, saved: int) -> float | None:
    """**done %**, stepq's one progress figure (status, ``stepq_done_percent``, the documented
    SQL): the rollouts drawn over the rollouts the set will draw at most, its exhaustive plan
    (M per prefix) less what the budget saved on finished trajectories.  It reaches 100 when
    every trajectory is labelled, under any budget; the savings are shown beside it, never
    counted as done.  None while nothing is planned (a set not annotated yet)."""
    if planned <= 0:
        return None
    to_draw = planned - saved
    return round(100.0 * done / to_draw, 1) if to_draw > 0 else 100.0


def collect(
    db: Database, queue_depth: Callable[[], int | None] | None = None, rates: dict[int, float] | None = None
) -> dict[str, Any]:
    """Progress per set, its current rollouts/s and ETA, troubles, work states, workers and the
    dispatcher.  ``rates``: a set's rollouts/s as its caller measured it (``stepq run``: its own
    run's average; the dispatcher's progress samples are for a fleet)."""
    with db.session() as s:
        rows = queries.progress(s)
        now = time.time()
        earlier = queries.progress_since(s, now - RATE_WINDOW_S)
        work = queries.work_counts(s)
        workers = queries.live_workers(s, time.time() - WORKER_LIVE_S)
        troubles = jobs.troubles(s, ROLLOUT_WORK)
        ordered = queries.priority_summary(s)
        dispatcher = queries.lock_state(s, "dispatcher")
    sets = []
    for r in rows:
        rate = (rates or {}).get(r["problem_set_id"])
        rate = _rate(r, earlier.get(r["problem_set_id"]), now) if rate is None else rate
        planned, saved = int(r["rollouts_planned"]), int(r["rollouts_saved"])
        left = max(0, planned - int(r["rollouts_done"]) - saved)
        share = r["positive_share"]
        trouble = troubles.get(r["problem_set_id"], {})
        sets.append(
            {
                "problem_set": r["problem_set"],
                "problem_set_id": r["problem_set_id"],
                "rollouts_per_prefix": int(r["rollouts_per_prefix"]),
                "label_rule": r["label_rule"],
                "problems": int(r["problems"]),
                "budget_policy": r["budget_policy"],
                "trajectories": int(r["trajectories"]),
                "trajectories_done": int(r["trajectories_done"]),
                "chunks": int(r["chunks"]),
                "rollouts_done": int(r["rollouts_done"]),
                "rollouts_planned": int(r["rollouts_planned"]),
                "rollouts_saved": saved,
                "rollouts_to_draw": planned - saved,
                "done_percent": done_percent(int(r["rollouts_done"]), planned, saved),
                "state": "not started" if not planned else ("done" if not left else "under way"),
                **_tokens(r),
                "labelled_chunks": int(r["labelled_chunks"]),
                "positive_share": None if share is None else round(float(share), 4),
                "rollouts_per_s": round(rate, 2),
                "eta_s": None if not planned else ((round(left / rate) if rate > 0 else None) if left else 0),
                "work": dict(r.get("work") or {}),
                "failed": int(trouble.get("failed", 0)),
                "retrying": int(trouble.get("retrying", 0)),
                "last_error": trouble.get("last_error"),
                "priority": ordered.get(r["problem_set_id"], {"strategy": "fifo"}),
            }
        )
    depth = queue_depth() if queue_depth else None
    return {"sets": sets, "work": work, "workers": workers, "broker_queue_depth": depth, "dispatcher": dispatcher}


def _tokens(row: dict[str, Any]) -> dict[str, Any]:
    """Generated tokens, per labelled chunk, and the tokens the budget saved, estimated at the
    set's mean tokens per rollout (a saved rollout was never generated: its length is unknown);
    the prompt tokens those rollouts continued, where the engine reported them."""
    tokens, rollouts, labelled = int(row.get("tokens") or 0), int(row["rollouts_done"]), int(row["labelled_chunks"])
    prompt = int(row.get("prompt_tokens") or 0)
    per_rollout = tokens / rollouts if rollouts else None
    return {
        "tokens": tokens,
        "tokens_per_labelled_chunk": round(tokens / labelled, 1) if labelled else None,
        "prompt_tokens": prompt,
        "prompt_tokens_per_labelled_chunk": round(prompt / labelled, 1) if labelled else None,
        "tokens_saved_estimate": None if per_rollout is None else round(int(row["rollouts_saved"]) * per_rollout),
    }


def _rate(row: dict[str, Any], sample: tuple[float, int] | None, now: float) -> float:
    """Rollouts/s since the oldest progress sample of the last minute, over the real time
    elapsed (a run 10 s old is measured over 10 s, not 60)."""
    if sample is None or now - sample[0] < 1.0:
        return 0.0
    return max(0, int(row["rollouts_done"]) - sample[1]) / (now - sample[0])


def _eta(seconds: int | None) -> str:
    if seconds is None:
        return "-"
    h, rest = divmod(int(seconds), 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


COLUMNS = (
    "set", "M", "rule", "budget", "problems", "done", "chunks", "rollouts", "%", "saved", "tokens",
    "~tokens saved", "labelled", "positive", "rollouts/s", "ETA", "failed", "retrying",
)  # fmt: skip
"""Every column of ``stepq status -v``."""
COMPACT = ("set", "M", "rule", "rollouts", "%", "labelled", "positive", "rollouts/s", "ETA", "failed")
"""The columns of the default table: a set's progress in under 100 characters."""
WIDTH = 100


def _row(r: dict[str, Any]) -> dict[str, str]:
    return {
        "set": r["problem_set"],
        "M": str(r["rollouts_per_prefix"]),
        "rule": r["label_rule"],
        "budget": r["budget_policy"].split(":")[0],
        "problems": str(r["problems"]),
        "done": f"{r['trajectories_done']}/{r['trajectories']}",
        "chunks": str(r["chunks"]),
        "rollouts": f"{r['rollouts_done']}/{r['rollouts_to_draw']}",
        "%": _percent(r),
        "saved": str(r["rollouts_saved"]),
        "tokens": _count(r["tokens"]),
        "~tokens saved": "-" if r["tokens_saved_estimate"] is None else _count(r["tokens_saved_estimate"]),
        "labelled": str(r["labelled_chunks"]),
        "positive": "-" if r["positive_share"] is None else f"{100 * r['positive_share']:.1f}%",
        "rollouts/s": f"{r['rollouts_per_s']:.1f}",
        "ETA": r["state"] if r["state"] != "under way" else _eta(r["eta_s"]),
        "failed": str(r["failed"]),
        "retrying": str(r["retrying"]),
    }


def render(report: dict[str, Any], verbose: bool = False) -> str:
    """A plain-text table: the compact columns in under 100 characters (a rule is shown by its
    name), every column with ``verbose`` (``stepq status -v``); all of it in ``--json``."""
    rows = [_row(r) for r in report["sets"]]
    head = list(COLUMNS if verbose else COMPACT)
    if not verbose:
        for row in rows:
            row["rule"] = row["rule"].split(":")[0]
    body = [[row[c] for c in head] for row in rows]

    def said(prefix: str, message: str) -> str:
        room = 160 if verbose else max(20, WIDTH - len(prefix))
        return prefix + message.splitlines()[0][:room]

    widths = [max(len(row[i]) for row in [head, *body]) for i in range(len(head))]
    lines = [
        "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True)))
        for row in [head, *body]
    ]
    if not body:
        lines = ["no problem sets yet: try 'stepq synth' or 'stepq ingest'"]
    for r in report["sets"]:
        order = r.get("priority") or {}
        if order.get("round") is not None:
            judge = f", judge: training run {order['judge_run_id']}" if order.get("judge_run_id") else ""
            scoring = ", ".join(f"{k} {v}" for k, v in sorted(order["scoring"].items())) or "none"
            lines.append(
                f"  {r['problem_set']}: order {order['strategy']} (priority round {order['round']}{judge}; "
                f"scoring jobs: {scoring})"
            )
            if order.get("last_error"):
                lines.append(said(f"  {r['problem_set']}: a scoring job failed: ", order["last_error"]))
        if r["last_error"]:
            lines.append(said(f"  {r['problem_set']}: last error: ", r["last_error"]))
    work = ", ".join(f"{k} {v}" for k, v in sorted(report["work"].items())) or "none"
    lines.append("")
    busy = sum(1 for w in report["workers"] if w["busy_items"])
    live = len(report["workers"])
    sick = [w for w in report["workers"] if w.get("unhealthy")]
    depth = report.get("broker_queue_depth")
    broker = "" if depth is None else f"; broker queue: {depth} messages"
    unwell = f", {len(sick)} unhealthy" if sick else ""
    lines.append(f"work items: {work}; workers: {live} live ({busy} busy, {live - busy} idle{unwell}){broker}")
    lines.append(_dispatcher_line(report.get("dispatcher")))
    waiting = sum(report["work"].get(state, 0) for state in ("pending", "queued"))
    if report.get("dispatcher") is None and waiting:
        idle = f"{live - busy} live workers idle: " if live - busy else ""
        lines.append(
            f"  {idle}{waiting} work items wait and nothing publishes them: start 'stepq dispatch' "
            "(or run a set on this machine alone: 'stepq run --set NAME')"
        )
    for w in sick:
        lines.append(said(f"  worker {w['label'] or w['name']} takes no work: ", w["unhealthy"]))
    for w in report["workers"]:
        if w.get("refused"):
            lines.append(said(f"  worker {w['label'] or w['name']} refuses work: ", w["refused"]))
    return "\n".join(lines)


def worker_liveness(db: Database, hostname: str, max_age_s: float = WORKER_LIVE_S) -> tuple[bool, str]:
    """Whether this host's worker is alive, read from its row (a liveness probe: Kubernetes
    restarts a container whose worker froze, lost its database or stopped taking work)."""
    with db.session() as s:
        rows = queries.host_workers(s, hostname)
    if not rows:
        return False, f"no running worker of host {hostname} has written a heartbeat"
    w = rows[0]
    age = epoch() - w["last_heartbeat"]
    if age > max_age_s:
        return False, f"worker {w['name']}: last heartbeat {age:.0f} s ago (more than {max_age_s:g} s)"
    if w["unhealthy"]:
        return False, f"worker {w['name']} takes no work: {w['unhealthy'].splitlines()[0]}"
    return True, f"worker {w['name']}: heartbeat {age:.0f} s ago, {w['busy_items']} items in hand"


def _dispatcher_line(state: dict[str, Any] | None) -> str:
    if state is None:
        return "dispatcher: none running"
    since = (
        "" if state["since"] is None else f" since {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(state['since']))}"
    )
    return f"dispatcher: {state['holder']}{since} (its lease runs {max(0, state['expires_at'] - epoch()):.0f} s more)"


def _count(n: int) -> str:
    """Token counts run to billions: 1234 -> 1.2k, 5600000 -> 5.6M."""
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.1f}{unit}"
    return str(n)


def _percent(row: dict[str, Any]) -> str:
    return "-" if row["done_percent"] is None else f"{row['done_percent']:.1f}"


def watch(db: Database, *, interval_s: float, queue_depth: Callable[[], int | None] | None, echo: Callable[[str], None],
          stop: Callable[[], bool] = lambda: False) -> None:  # fmt: skip
    """Redraw the report every ``interval_s`` until interrupted (or ``stop()``)."""
    while True:
        report = render(collect(db, queue_depth))
        echo(f"\x1b[2J\x1b[H{time.strftime('%H:%M:%S')}  stepq status (Ctrl-C to leave)\n\n{report}")
        if stop():
            return
        time.sleep(interval_s)
