"""Prioritised annotation: strategies that turn a judge's scores into priorities, the rounds
that plan scoring, and the scoring handler."""
