"""stepq: a distributed, resumable, incremental annotation queue for step-level reward labels."""

__version__ = "0.1.0"
