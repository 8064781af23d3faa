"""Monte Carlo labelling: the rollouts handler, its budget, grading, Q-values and labels, and
the plans that say what a set still needs."""
