"""Step search: sample candidate next steps, rank them with a pairwise judge (asked in both
orders), keep the best and record (best, worst) as a step preference pair; queue work like
rollouts."""
