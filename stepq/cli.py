"""The ``stepq`` command line: thin commands over the models, workers and trainer packages.

The group and what every command shares are in ``stepq.commands.base``; the commands live by
concept in ``stepq.commands`` (data, annotation, sets, services, trainer, evaluation), and importing them
registers them on ``main``.
"""

from stepq.commands import annotation, data, evaluation, search, services, sets, trainer
from stepq.commands.base import main

__all__ = ["annotation", "data", "evaluation", "main", "search", "services", "sets", "trainer"]
