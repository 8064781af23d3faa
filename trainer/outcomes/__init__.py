"""Outcome-labelled solutions for discriminative PRMs, from the same stored rows."""
