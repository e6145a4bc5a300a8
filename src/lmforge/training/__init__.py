"""Training: one task-agnostic loop (``Trainer``) with objectives, AdamW and schedules, checkpoints, DDP and logs.

See ``lmforge.training.trainer`` for the objective / data contracts, and ``lmforge.training.run_folder``
(``RunOutput``) for the run-folder layout.
"""

from lmforge.training.checkpoint import latest_checkpoint, load_trainer_state, save_checkpoint
from lmforge.training.distributed import DistInfo, cleanup_distributed, init_distributed
from lmforge.training.optim import build_optimizer, build_scheduler, decay_parameter_names, lr_multiplier
from lmforge.training.run_folder import RunOutput
from lmforge.training.trainer import (
    RESUMABLE_CHANGES,
    Objective,
    ObjectiveOutput,
    TrainData,
    Trainer,
    TrainingInterrupted,
)

__all__ = [
    "RESUMABLE_CHANGES", "DistInfo", "Objective", "ObjectiveOutput", "RunOutput", "TrainData", "Trainer",
    "TrainingInterrupted", "build_optimizer",
    "build_scheduler", "cleanup_distributed", "decay_parameter_names", "init_distributed", "latest_checkpoint",
    "load_trainer_state", "lr_multiplier", "save_checkpoint",
]
