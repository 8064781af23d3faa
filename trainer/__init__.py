"""The trainer: labelled chunks -> snapshots -> judges, and the evaluation of judges.

``snapshots/`` freezes balanced labelled chunks; ``judge/`` is the StepWiser judge's prompt,
verdict parsing and rewards; ``training/`` runs GRPO (TRL) and records runs; ``evaluation/``
scores judges (ProcessBench, validation splits, Best-of-N, chunk-reset).  It may import
``stepq.workers`` and ``stepq.models``; nothing below it imports it.
"""
