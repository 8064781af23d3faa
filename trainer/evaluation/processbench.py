"""ProcessBench: predict the index of the first wrong step (-1 if none).

Score (the official ``run_eval.py``), per subset: accuracy on erroneous samples (label != -1,
prediction equals the label exactly), accuracy on all-correct samples (label -1 predicted
-1), and their harmonic mean; an unparseable prediction counts as wrong.

A generative judge is asked step by step; a scoring judge (a PRM) scores every step once and
predicts the first step below a threshold, chosen on one subset (``choose_threshold``).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from stepq.models.errors import ConfigError, InputError
from stepq.trainer.evaluation.judges import StepItem, StepJudge, judge_stats


@dataclass(frozen=True)
class SubsetScore:
    subset: str
    samples: int
    erroneous: int
    correct: int
    acc_error: float
    acc_correct: float
    f1: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def score(subset: str, labels: Mapping[str, int], predictions: Mapping[str, Any]) -> SubsetScore:
    """Score predictions (id -> index) against labels (id -> index); a missing or non-integer
    prediction is wrong.  Accuracies and F1 are percentages."""
    err_hits = err_n = ok_hits = ok_n = 0
    for sid, label in labels.items():
        pred = predictions.get(sid)
        valid = isinstance(pred, int) and not isinstance(pred, bool)
        if label == -1:
            ok_n += 1
            ok_hits += valid and pred == -1
        else:
            err_n += 1
            err_hits += valid and pred == label
    acc_error = 100.0 * err_hits / err_n if err_n else 0.0
    acc_correct = 100.0 * ok_hits / ok_n if ok_n else 0.0
    f1 = 2 * acc_error * acc_correct / (acc_error + acc_correct) if acc_error + acc_correct else 0.0
    return SubsetScore(subset, len(labels), err_n, ok_n, acc_error, acc_correct, f1)


def load_samples(path: Path) -> list[dict[str, Any]]:
    """A ProcessBench file: a JSON array of {id, problem, steps, label, ...}."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(str(path), None, None, f"cannot read: {exc}") from None
    except json.JSONDecodeError as exc:
        raise InputError(str(path), exc.lineno, None, f"invalid JSON: {exc.msg}") from None
    if not isinstance(data, list):
        raise InputError(str(path), None, None, "expected a JSON array of samples")
    for i, s in enumerate(data):
        for key, kind in (("id", str), ("problem", str), ("steps", list), ("label", int)):
            if not isinstance(s, dict) or not isinstance(s.get(key), kind):
                raise InputError(str(path), None, key, f"sample {i}: missing or not a {kind.__name__}")
    return data


def load_predictions(path: Path) -> dict[str, Any]:
    """A JSONL of {"id", "prediction"}."""
    out: dict[str, Any] = {}
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            out[str(row["id"])] = row["prediction"]
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise InputError(str(path), n, "prediction", f"expected {{'id', 'prediction'}}: {exc}") from None
    return out


def write_outputs(out_dir: Path, predictions: Mapping[str, Any], report: Mapping[str, Any]) -> None:
    """``predictions.jsonl`` (readable back by ``load_predictions``) and ``scores.json``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    with (out_dir / "predictions.jsonl").open("w") as fh:
        for sid, pred in predictions.items():
            fh.write(json.dumps({"id": sid, "prediction": pred}) + "\n")
    (out_dir / "scores.json").write_text(json.dumps(report, indent=2) + "\n")


def predict(
    judge: StepJudge,
    samples: Sequence[dict[str, Any]],
    on_progress: Callable[[int], None] | None = None,
) -> dict[str, int]:
    """First step judged negative per sample (-1 if none), judging step by step and stopping a
    sample at its first negative.  All samples' step i go to the judge in one batch."""
    predictions: dict[str, int] = {}
    alive = list(samples)
    step = 0
    while alive:
        batch = [s for s in alive if step < len(s["steps"])]
        for s in alive:
            if step >= len(s["steps"]):
                predictions[s["id"]] = -1
                if on_progress:
                    on_progress(1)
        if not batch:
            break
        items = [
            StepItem(
                s["problem"],
                tuple(s["steps"][:step]),
                s["steps"][step],
                {"id": s["id"], "step": step, "label": s["label"]},
            )
            for s in batch
        ]
        verdicts = judge.judge(items)
        alive = []
        for s, verdict in zip(batch, verdicts, strict=True):
            if verdict is True:
                alive.append(s)
            else:
                predictions[s["id"]] = step
                if on_progress:
                    on_progress(1)
        step += 1
    return predictions


def subset_name(path: Path) -> str:
    return path.stem


# --- scoring judges (discriminative PRMs): one pass of scores, then any threshold ---------


def first_below(scores: Sequence[float | None], threshold: float) -> int:
    """The first step scored below ``threshold`` (no score counts as below), -1 if none."""
    return next((i for i, s in enumerate(scores) if s is None or s < threshold), -1)


def predictions_at(step_scores: Mapping[str, Sequence[float | None]], threshold: float) -> dict[str, int]:
    return {sid: first_below(scores, threshold) for sid, scores in step_scores.items()}


def choose_threshold(
    step_scores: Mapping[str, Sequence[float | None]], labels: Mapping[str, int], max_candidates: int = 2000
) -> float:
    """The threshold with the best ProcessBench F1 on these samples (ties: the lowest).

    Candidates are the midpoints between consecutive distinct step scores, plus one below and
    one above them all; F1 only changes where the threshold crosses a score, so no better one
    exists.  Choose it on one subset and report the others with it: choosing it on the
    subset being scored flatters the judge.
    """
    values = sorted({s for scores in step_scores.values() for s in scores if s is not None})
    if not values:
        return 0.5
    candidates = [values[0] - 1e-6, *((a + b) / 2 for a, b in itertools.pairwise(values)), values[-1] + 1e-6]
    if len(candidates) > max_candidates:  # a fine grid is as good as every midpoint for a report
        step = len(candidates) / max_candidates
        candidates = [candidates[int(i * step)] for i in range(max_candidates)] + [candidates[-1]]
    best, best_f1 = candidates[0], -1.0
    for t in candidates:
        f1 = score("tune", labels, predictions_at(step_scores, t)).f1
        if f1 > best_f1 + 1e-12:
            best, best_f1 = t, f1
    return best


def at_oracle_threshold(
    step_scores: Mapping[str, Sequence[float | None]], labels: Mapping[str, int]
) -> tuple[float, dict[str, int]]:
    """The best of up to ``ORACLE_CANDIDATES`` thresholds on these very samples, and the
    predictions at it (the outcome-supervised PRM paper's appendix protocol: it flatters)."""
    chosen = choose_threshold(step_scores, labels, ORACLE_CANDIDATES)
    return chosen, predictions_at(step_scores, chosen)


def sample_scores(judge: Any, samples: Sequence[dict[str, Any]]) -> dict[str, list[float | None]]:
    """Every step's score of every sample, from a judge with ``score_solutions`` (or, for
    scores computed elsewhere, ``score_samples`` by sample id)."""
    if hasattr(judge, "score_samples"):
        return dict(judge.score_samples(samples))
    rows = judge.score_solutions([(s["problem"], s["steps"]) for s in samples])
    return {s["id"]: row for s, row in zip(samples, rows, strict=True)}


# --- the whole evaluation, as ``stepq eval processbench`` runs it --------------------------

ORACLE = "oracle"
"""A threshold chosen on the very subset it scores: the best F1 the judge's scores allow."""
ORACLE_CANDIDATES = 10_000
"""The outcome-supervised PRM paper searches 10,000 thresholds per subset."""


def evaluate(
    files: Sequence[Path],
    judge: Any = None,
    *,
    scoring: bool = False,
    predictions: Mapping[str, Any] | None = None,
    threshold: float = 0.5,
    tune_file: Path | None = None,
    subset_tune_files: Mapping[str, Path] | None = None,
    oracle_threshold: bool = False,
    on_subset: Callable[[str, int], Callable[[int], None] | None] | None = None,
    limit: int | None = None,
) -> dict[str, Any]:
    """Score ``judge`` (or given ``predictions``) on each ProcessBench file.

    The report holds, per subset, the official metric and what the judge wrote (outputs with
    no verdict, outputs cut by the length limit); with a scoring judge, the threshold and
    the file it was tuned on (never the file being scored, unless the user says so).
    ``subset_tune_files`` maps a subset (a file's stem) to the file its own threshold is
    chosen on, as much of the PRM literature tunes per subset; the others use ``threshold``
    (or the one chosen on ``tune_file``: ProcessBench's main results use one for all).
    ``oracle_threshold``: every subset is scored at the best of up to ``ORACLE_CANDIDATES``
    thresholds on its own samples (the outcome-supervised PRM paper's appendix protocol); the
    report names it ``oracle``, since the scored data chose it.  ``limit``: only the first so
    many samples of each scored file (a quick look; a threshold is still chosen on a whole file).
    """
    if (judge is None) == (predictions is None):
        raise ValueError("give a judge or predictions")
    per_subset = dict(subset_tune_files or {})
    if (tune_file is not None or per_subset or oracle_threshold) and not scoring:
        raise ConfigError(
            "threshold tuning needs a scoring judge (--judge prm, --judge scores, or --score-by votes|logprob)"
        )
    if oracle_threshold and (tune_file is not None or per_subset):
        raise ConfigError("an oracle threshold is chosen on each subset itself: drop --tune-threshold-on/--tune-subset")
    unknown = sorted(set(per_subset) - {subset_name(p) for p in files})
    if unknown:
        raise ConfigError(f"no --data file for subset(s) {', '.join(unknown)} (a subset is its file's name)")
    if tune_file is not None:
        threshold = _tuned(judge, tune_file)
    thresholds = {name: (_tuned(judge, f), subset_name(f)) for name, f in per_subset.items()}
    default = (threshold, subset_name(tune_file) if tune_file else None)
    subsets, all_predictions = [], {}
    for path in files:
        samples = load_samples(path)[:limit]
        labels = {s["id"]: s["label"] for s in samples}
        before = judge_stats(judge)
        if predictions is not None:
            missing = [sid for sid in labels if sid not in predictions]
            if missing:
                raise InputError(
                    str(path),
                    None,
                    "id",
                    f"{len(missing)} of {len(labels)} samples have no prediction (first: {', '.join(missing[:3])})",
                )
            found = {sid: predictions[sid] for sid in labels}
        elif scoring:
            step_scores = sample_scores(judge, samples)
            if oracle_threshold:
                chosen, found = at_oracle_threshold(step_scores, labels)
                thresholds[subset_name(path)] = (chosen, ORACLE)
            else:
                found = dict(predictions_at(step_scores, thresholds.get(subset_name(path), default)[0]))
        else:
            advance = on_subset(subset_name(path), len(samples)) if on_subset else None
            found = dict(predict(judge, samples, advance))
        all_predictions.update(found)
        row = score(subset_name(path), labels, found).as_dict()
        if predictions is None:
            row.update(judge_stats(judge).since(before).as_dict())
        if scoring:
            row["threshold"], row["threshold_tuned_on"] = thresholds.get(subset_name(path), default)
        subsets.append(row)
    report: dict[str, Any] = {
        "subsets": subsets,
        "no_verdict_is": "a rejection (that step is predicted as the first error)",
    }
    if scoring and not oracle_threshold:
        report["threshold"] = threshold
        report["threshold_tuned_on"] = subset_name(tune_file) if tune_file else None
    if scoring:
        report["threshold_protocol"] = (
            ORACLE
            if oracle_threshold
            else "per subset"
            if per_subset
            else ("one threshold, tuned" if tune_file else "one threshold, given")
        )
    if limit is not None:
        report["limit"] = limit
    if len(subsets) > 1:
        report["average_f1"] = sum(s["f1"] for s in subsets) / len(subsets)
    report["predictions"] = all_predictions
    return report


def _tuned(judge: Any, tune_file: Path) -> float:
    tune = load_samples(tune_file)
    return choose_threshold(sample_scores(judge, tune), {s["id"]: s["label"] for s in tune})
