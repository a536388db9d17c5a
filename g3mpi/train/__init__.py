"""Training: configuration, the distributed trainer, the run directory."""
from .config import ConfigError, TrainConfig, config_from, to_toml
from .trainer import Trainer, prepare_run_dir

__all__ = ["ConfigError", "TrainConfig", "config_from", "to_toml", "Trainer", "prepare_run_dir"]
