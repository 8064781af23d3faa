"""The user-facing error tree (defined in ``models.errors``, the lowest layer)."""

from stepq.models.errors import (
    BrokerError,
    ConfigError,
    DatabaseError,
    InputError,
    LeaseLost,
    NotFoundError,
    StepqError,
    TrainingBusy,
    WorkFailed,
)

__all__ = [
    "BrokerError",
    "ConfigError",
    "DatabaseError",
    "InputError",
    "LeaseLost",
    "NotFoundError",
    "StepqError",
    "TrainingBusy",
    "WorkFailed",
]
