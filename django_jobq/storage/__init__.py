"""Storage backends behind one interface (see ``base.Storage``)."""

from .base import Ack, ClaimBatch, ReapReport, Storage, WorkerRecord

__all__ = ["Ack", "ClaimBatch", "ReapReport", "Storage", "WorkerRecord"]
