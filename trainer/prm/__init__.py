"""A discriminative PRM learned from outcome labels: aggregates and loss, the model, its trainer."""
