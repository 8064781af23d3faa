"""The outcome-supervised PRM's aggregates and loss (pure torch): values against hand
computation, where the gradient goes, softmin's limits, padding, and numeric safety."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from stepq.trainer.prm.aggregate import (
    log_geomean,
    log_min,
    log_softmin,
    outcome_loss,
    predict_log_prob,
    softmin_logit,
    solution_log_prob,
)


def _logit(p: float) -> float:
    return math.log(p / (1 - p))


def _batch(rows: list[list[float]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Probabilities per step (ragged) -> padded logits and mask."""
    width = max(len(r) for r in rows)
    logits = torch.zeros(len(rows), width, dtype=torch.float64)
    mask = torch.zeros(len(rows), width, dtype=torch.bool)
    for i, r in enumerate(rows):
        logits[i, : len(r)] = torch.tensor([_logit(p) for p in r], dtype=torch.float64)
        mask[i, : len(r)] = True
    return logits, mask


def test_min_and_geomean_match_hand_computation_and_ignore_padding() -> None:
    logits, mask = _batch([[0.9, 0.2, 0.6], [0.5]])
    assert log_min(logits, mask).exp().tolist() == pytest.approx([0.2, 0.5])
    assert log_geomean(logits, mask).exp().tolist() == pytest.approx([(0.9 * 0.2 * 0.6) ** (1 / 3), 0.5])
    # padding with any logit changes nothing
    logits[1, 1:] = -30.0
    assert log_min(logits, mask).exp().tolist() == pytest.approx([0.2, 0.5])
    assert log_geomean(logits, mask).exp().tolist() == pytest.approx([(0.9 * 0.2 * 0.6) ** (1 / 3), 0.5])


def test_softmin_is_the_papers_function_of_the_step_logits() -> None:
    """A = -tau * log((1/M) * sum exp(-r_m / tau)) on logits r = (2, -1, 0.5), tau = 0.5:
    exp(-4) + exp(2) + exp(-1) = 0.0183156 + 7.3890561 + 0.3678794 = 7.7752511;
    /3 = 2.5917504; log = 0.9523336; A = -0.4761668; sigmoid(A) = 0.3831577."""
    logits = torch.tensor([[2.0, -1.0, 0.5]], dtype=torch.float64)
    mask = torch.ones_like(logits, dtype=torch.bool)
    assert softmin_logit(logits, mask, 0.5).item() == pytest.approx(-0.4761668, abs=1e-6)
    assert log_softmin(logits, mask, 0.5).exp().item() == pytest.approx(0.3831577, abs=1e-6)
    # not the softmax-weighted mean of probabilities it once was
    p = torch.sigmoid(logits)[0]
    w = torch.softmax(-p / 0.5, dim=0)
    assert abs(log_softmin(logits, mask, 0.5).exp().item() - float((w * p).sum())) > 0.05
    # padding is ignored: M counts the solution's own steps
    padded = torch.tensor([[2.0, -1.0, 0.5, 9.0]], dtype=torch.float64)
    assert softmin_logit(padded, torch.tensor([[True, True, True, False]]), 0.5).item() == pytest.approx(-0.4761668)


def test_softmin_tends_to_min_as_temperature_falls_and_to_the_mean_logit_as_it_grows() -> None:
    p = [0.9, 0.35, 0.6, 0.8]
    logits, mask = _batch([p])
    gaps = [abs(log_softmin(logits, mask, t).exp().item() - min(p)) for t in (1.0, 0.3, 0.1, 0.03, 0.01)]
    assert all(a > b for a, b in itertools.pairwise(gaps)), gaps
    assert gaps[-1] < 1e-2
    mean_logit = sum(_logit(x) for x in p) / len(p)
    assert softmin_logit(logits, mask, 1e4).item() == pytest.approx(mean_logit, abs=1e-3)


def _grad(rows: list[list[float]], outcome: list[int], how: str, temperature: float = 0.1) -> torch.Tensor:
    logits, mask = _batch(rows)
    logits.requires_grad_(True)
    outcome_loss(logits, mask, torch.tensor(outcome), how, temperature).backward()
    assert logits.grad is not None
    return logits.grad


def test_min_sends_the_whole_gradient_to_the_lowest_step() -> None:
    for outcome in (0, 1):
        g = _grad([[0.9, 0.2, 0.6]], [outcome], "min")[0]
        assert g[1] != 0 and g[0] == 0 and g[2] == 0
        # a correct outcome raises the weakest step (loss falls as its logit rises)
        assert (g[1] < 0) == (outcome == 1)


def test_asymmetric_loss_is_min_for_correct_and_geomean_for_incorrect_outcomes() -> None:
    rows = [[0.9, 0.2, 0.6], [0.9, 0.2, 0.6]]
    g = _grad(rows, [1, 0], "asymmetric")
    # correct: only the lowest-scoring step moves, upwards
    assert g[0, 1] < 0 and g[0, 0] == 0 and g[0, 2] == 0
    # incorrect: every step is pushed down (positive gradient on every logit)
    assert bool((g[1] > 0).all())
    # and the values are exactly those of the two plain aggregates
    logits, mask = _batch(rows)
    lp = solution_log_prob(logits, mask, "asymmetric", outcome=torch.tensor([1, 0]))
    assert lp[0].item() == pytest.approx(log_min(logits, mask)[0].item())
    assert lp[1].item() == pytest.approx(log_geomean(logits, mask)[1].item())


def test_a_prediction_never_reads_the_outcome() -> None:
    """What the training log reports: a wrong solution whose weakest step is low but whose
    geometric mean is high is predicted wrong under asymmetric (its prediction is min),
    whichever outcome it carries; choosing the aggregate by the true outcome graded it by
    geomean and called it a miss."""
    logits, mask = _batch([[0.95, 0.3, 0.95], [0.95, 0.3, 0.95]])
    predicted = predict_log_prob(logits, mask, "asymmetric").exp()
    assert predicted.tolist() == pytest.approx([0.3, 0.3])
    peeked = solution_log_prob(logits, mask, "asymmetric", outcome=torch.tensor([1, 0])).exp()
    assert peeked[1].item() > 0.5 > predicted[1].item(), "the outcome would have changed the verdict"
    for how in ("min", "geomean", "softmin", "last"):
        assert torch.equal(predict_log_prob(logits, mask, how), solution_log_prob(logits, mask, how))


def test_the_orm_scores_a_solution_by_its_last_step_only() -> None:
    """The outcome reward model baseline: log P is the last real step's (padding ignored),
    and its loss moves only that step's logit."""
    logits, mask = _batch([[0.9, 0.2, 0.6], [0.7]])
    assert solution_log_prob(logits, mask, "last").exp().tolist() == pytest.approx([0.6, 0.7])
    g = _grad([[0.9, 0.2, 0.6], [0.7, 0.4]], [1, 0], "last")
    assert g[0, 0] == 0 and g[0, 1] == 0 and g[0, 2] < 0
    assert g[1, 0] == 0 and g[1, 1] > 0


def test_geomean_spreads_the_gradient_over_every_step() -> None:
    g = _grad([[0.9, 0.2, 0.6]], [1], "geomean")[0]
    assert bool((g < 0).all())


def test_softmin_gradient_concentrates_on_the_lowest_step_as_temperature_falls() -> None:
    shares = []
    for tau in (1.0, 0.1, 0.02):
        g = _grad([[0.9, 0.2, 0.6]], [1], "softmin", tau)[0].abs()
        shares.append((g[1] / g.sum()).item())
    assert shares[0] < shares[1] < shares[2] and shares[2] > 0.99


def test_loss_is_the_bce_of_the_outcome_on_the_aggregate() -> None:
    logits, mask = _batch([[0.9, 0.2, 0.6], [0.7, 0.8]])
    loss = outcome_loss(logits, mask, torch.tensor([1, 0]), "min").item()
    assert loss == pytest.approx(-(math.log(0.2) + math.log(1 - 0.7)) / 2)


def test_extreme_logits_stay_finite() -> None:
    logits = torch.tensor([[60.0, 60.0], [-60.0, 60.0]], requires_grad=True)
    mask = torch.ones(2, 2, dtype=torch.bool)
    for how in ("min", "geomean", "softmin", "asymmetric"):
        loss = outcome_loss(logits, mask, torch.tensor([0, 1]), how)
        loss.backward()
        assert math.isfinite(loss.item()) and logits.grad is not None and bool(torch.isfinite(logits.grad).all())
        logits.grad = None


def test_bad_inputs_are_refused() -> None:
    logits, mask = _batch([[0.5, 0.5]])
    with pytest.raises(ValueError, match="unknown aggregate"):
        solution_log_prob(logits, mask, "max")
    with pytest.raises(ValueError, match="needs the outcomes"):
        solution_log_prob(logits, mask, "asymmetric")
    with pytest.raises(ValueError, match="at least one step"):
        log_min(logits, torch.zeros_like(mask))
    with pytest.raises(ValueError, match="temperature"):
        log_softmin(logits, mask, 0.0)


def test_best_of_n_softmin_is_the_trainers_softmin_on_probabilities() -> None:
    from stepq.trainer.evaluation.best_of_n import AGGREGATORS, softmin

    p = [0.9, 0.35, 0.6, 0.8]
    logits, mask = _batch([p])
    for tau in (0.02, 0.1, 1.0):
        assert softmin(p, tau) == pytest.approx(log_softmin(logits, mask, tau).exp().item(), rel=1e-9)
    assert AGGREGATORS["softmin"](p) == pytest.approx(softmin(p, 0.1))
    assert softmin([1e-9, 1.0 - 1e-9], 0.001) == pytest.approx(1e-9, rel=1e-3)  # no overflow at small tau
