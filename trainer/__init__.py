"""Snapshots, judge training (GRPO) and evaluation: built on the labelled chunks.

Empty for now: its content comes with the trainer issue.  It may import ``workers`` and
``models``; nothing below it imports it.
"""
