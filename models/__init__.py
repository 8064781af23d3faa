"""The database: tables grouped by concept, engine/session setup, and every query."""

from models.base import Base, epoch
from models.db import Database
from models.problems import Problem, ProblemSet
from models.rollouts import ChunkLabel, QValue, Rollout
from models.trajectories import Chunk, Trajectory
from models.work import Lock, RolloutWork, Worker

__all__ = [
    "Base",
    "Chunk",
    "ChunkLabel",
    "Database",
    "Lock",
    "Problem",
    "ProblemSet",
    "QValue",
    "Rollout",
    "RolloutWork",
    "Trajectory",
    "Worker",
    "epoch",
]
