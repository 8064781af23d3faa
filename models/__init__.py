"""The database: tables grouped by concept, engine/session setup, and every query."""

from stepq.models.base import Base, epoch
from stepq.models.counters import EventCount, LabelCounters, ProgressSample, SetCounters
from stepq.models.db import Database
from stepq.models.prioritization import PriorityRound, PriorityScoring
from stepq.models.problems import Problem, ProblemSet
from stepq.models.rollouts import ChunkLabel, QValue, Rollout
from stepq.models.search import SearchTurn, StepSearch
from stepq.models.snapshots import Snapshot, SnapshotRow, SnapshotText
from stepq.models.training import TrainingMetric, TrainingRun
from stepq.models.trajectories import Chunk, Trajectory
from stepq.models.work import Lock, RolloutWork, Worker

__all__ = [
    "Base",
    "Chunk",
    "ChunkLabel",
    "Database",
    "EventCount",
    "LabelCounters",
    "Lock",
    "PriorityRound",
    "PriorityScoring",
    "Problem",
    "ProblemSet",
    "ProgressSample",
    "QValue",
    "Rollout",
    "RolloutWork",
    "SearchTurn",
    "SetCounters",
    "Snapshot",
    "SnapshotRow",
    "SnapshotText",
    "StepSearch",
    "TrainingMetric",
    "TrainingRun",
    "Trajectory",
    "Worker",
    "epoch",
]
