"""Step preference pairs for step-wise DPO, from the same stored rollouts and trajectories."""
