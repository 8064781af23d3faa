"""Judge training: recipes, the GRPO run (TRL), run records, and the trainer service."""
