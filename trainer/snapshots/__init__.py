"""Snapshots: immutable, balanced, problem-split sets of labelled chunks."""
