"""How a discriminative PRM learns step scores from outcome labels alone (pure torch).

The model gives one logit r_m per step; ``sigmoid`` of it is the step's chance of being
right.  Only the solution's outcome is known, so the loss is BCE of the outcome against an
*aggregate* of the step scores, the solution's chance of being right if its steps are.  The
aggregate decides where the gradient goes:

- ``min``: a solution is right only if its worst step is; all gradient reaches the lowest
  step (the one most likely to be the error).
- ``geomean``: the geometric mean of the step probabilities, (prod_m p_m)^(1/M); every step
  shares the gradient equally.
- ``softmin`` (temperature tau): A = -tau * log((1/M) * sum_m exp(-r_m / tau)), as the
  outcome-supervised PRM paper defines it, and P = sigmoid(A).  The paper leaves open whether
  r are logits or probabilities (its geometric mean needs probabilities, the sigmoid of its
  loss a logit); stepq takes the step *logits*, so P tends to sigmoid(min r) = min p as
  tau -> 0 and to sigmoid(mean r) as tau grows.
- ``asymmetric``: ``min`` for correct outcomes (every step must be right, so raise the
  weakest) and ``geomean`` for incorrect ones (some step is wrong, but which is unknown, so
  lower them all a little rather than punish one guess).
- ``last``: the outcome reward model (ORM), the paper's baseline on the same backbone: only
  the score after the last step is trained against the outcome.  The earlier steps' scores
  are what the same model says of the partial solution, trained by nothing but its end.

A loss may read the outcome (``asymmetric`` does); a *prediction* may not.  ``predict_log_prob``
is what a trained PRM says of a solution: the configured aggregate, and for ``asymmetric``
its ``min`` (a solution is right when its weakest step is: what the loss asks of right ones).

Every function takes ``logits`` and a boolean ``mask`` of shape [batch, steps] (padding is
False) and works in log space, so probabilities near 0 or 1 stay finite.
"""

from __future__ import annotations

from typing import Any

AGGREGATES = ("min", "geomean", "softmin", "asymmetric", "last")
PREDICTED_BY = {"asymmetric": "min"}
"""The aggregate a loss that reads the outcome predicts with."""


def _check(logits: Any, mask: Any) -> None:
    if logits.shape != mask.shape:
        raise ValueError(f"logits {tuple(logits.shape)} and mask {tuple(mask.shape)} differ")
    if not bool(mask.any(dim=-1).all()):
        raise ValueError("every solution needs at least one step")


def log_min(logits: Any, mask: Any) -> Any:
    """log P(solution right) = the lowest step's log-probability."""
    import torch.nn.functional as F

    _check(logits, mask)
    logp = F.logsigmoid(logits).masked_fill(~mask, 0.0)
    return logp.masked_fill(~mask, float("inf")).amin(dim=-1)


def log_geomean(logits: Any, mask: Any) -> Any:
    """log of the geometric mean of the step probabilities (the mean log-probability)."""
    import torch.nn.functional as F

    _check(logits, mask)
    logp = F.logsigmoid(logits).masked_fill(~mask, 0.0)
    return logp.sum(dim=-1) / mask.sum(dim=-1)


def softmin_logit(logits: Any, mask: Any, temperature: float) -> Any:
    """A = -tau * log((1/M) * sum_m exp(-r_m / tau)) over each solution's M steps (a logit)."""
    import torch

    if temperature <= 0:
        raise ValueError("softmin temperature must be positive")
    _check(logits, mask)
    scaled = (-logits / temperature).masked_fill(~mask, float("-inf"))
    count = mask.sum(dim=-1).to(logits.dtype)
    return -temperature * (torch.logsumexp(scaled, dim=-1) - torch.log(count))


def log_softmin(logits: Any, mask: Any, temperature: float) -> Any:
    """log sigmoid(A), A the softmin of the step logits (``softmin_logit``)."""
    import torch.nn.functional as F

    return F.logsigmoid(softmin_logit(logits, mask, temperature))


def log_last(logits: Any, mask: Any) -> Any:
    """log P(solution right) = the last step's log-probability (an outcome reward model)."""
    import torch.nn.functional as F

    _check(logits, mask)
    last = mask.long().sum(dim=-1) - 1  # steps are left-aligned: the last real one
    return F.logsigmoid(logits.gather(-1, last.unsqueeze(-1)).squeeze(-1))


def predict_log_prob(logits: Any, mask: Any, how: str, temperature: float = 0.1) -> Any:
    """log P(solution right) as the trained model predicts it: never from the outcome."""
    return solution_log_prob(logits, mask, PREDICTED_BY.get(how, how), temperature)


def solution_log_prob(logits: Any, mask: Any, how: str, temperature: float = 0.1, outcome: Any = None) -> Any:
    """log P(solution right) under the aggregate ``how`` (``asymmetric`` needs ``outcome``)."""
    import torch

    if how == "min":
        return log_min(logits, mask)
    if how == "geomean":
        return log_geomean(logits, mask)
    if how == "softmin":
        return log_softmin(logits, mask, temperature)
    if how == "last":
        return log_last(logits, mask)
    if how == "asymmetric":
        if outcome is None:
            raise ValueError("the asymmetric aggregate needs the outcomes")
        return torch.where(outcome.bool(), log_min(logits, mask), log_geomean(logits, mask))
    raise ValueError(f"unknown aggregate '{how}' (one of: {', '.join(AGGREGATES)})")


def outcome_loss(logits: Any, mask: Any, outcome: Any, how: str = "asymmetric", temperature: float = 0.1) -> Any:
    """Mean BCE of the outcomes (1 right, 0 wrong) against the aggregated step probabilities."""
    import torch

    log_p = solution_log_prob(logits, mask, how, temperature, outcome).clamp(max=-1e-7)
    log_not_p = torch.log(-torch.expm1(log_p))  # log(1 - P), exact near P = 1
    y = outcome.to(log_p.dtype)
    return -(y * log_p + (1 - y) * log_not_p).mean()


def step_loss(logits: Any, labelled: Any, targets: Any) -> Any:
    """Mean BCE of each labelled step's probability against its target (1 right, 0 wrong, or a
    Q-value in between): the step-label PRM's loss (Math-Shepherd trains on every step's label,
    hard or soft).  ``labelled`` marks the steps with a target; the others (the history a
    balanced snapshot left unlabelled, padding) add nothing."""
    import torch.nn.functional as F

    if not bool(labelled.any()):
        raise ValueError("a batch with no labelled step")
    y = targets.to(logits.dtype).masked_fill(~labelled, 0.0)
    per_step = F.binary_cross_entropy_with_logits(logits, y, reduction="none")
    return per_step.masked_fill(~labelled, 0.0).sum() / labelled.sum()
