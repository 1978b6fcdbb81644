"""The one typed config of verirl, and the only place defaults live.

Sections mirror the phases of a step: data -> model -> rollout -> reward -> algo ->
actor (the policy update) -> trainer (the loop) -> eval -> log. A run is configured by a
YAML file (or a recipe shipped inside the package, e.g. ``tiny``) plus ``a.b=c`` overrides
on the command line, merged through OmegaConf structured configs so that unknown keys and
wrong types are caught before anything heavy starts.

The dataclass defaults are for a real model (a Hugging Face directory of 0.5B-7B
parameters on one accelerator); the embedded default run on the tiny model is the ``tiny``
recipe (`verirl train` with no ``--config``). Each default says why in its meaning.

The package: `schema` (the dataclasses: each key's default, meaning and bounds), `values` (the
rules over values alone, run at load), `load` (YAML, recipes, overrides, old checkpoints' configs),
`reference` (docs/config.md) and `layout` (the ranks). It imports no other room of verirl
(`verirl.core` aside). Names and paths are checked by `verirl.run.checks`.

Batch sizes
-----------
* ``data.prompts_per_step`` counts PROMPTS; each prompt is sampled ``rollout.n`` times,
  so one step sees ``prompts_per_step * n`` sequences.
* ``actor.mini_batch_prompts`` counts PROMPTS too (not sequences: veRL's
  ``ppo_mini_batch_size`` is also in prompts, MindSpeed-RL's is not).  One optimizer
  step is taken per mini-batch.  ``mini_batch_prompts == prompts_per_step`` with
  ``actor.epochs == 1`` is on-policy: the old log-prob pass is skipped.
* ``actor.micro_batch_size`` counts SEQUENCES per forward/backward; gradients are
  accumulated over the micro-batches of a mini-batch, exactly.
"""
from verirl.config.load import (RECIPES, describe, flatten, load_config, load_config_dict, recipe_file, to_dict,
                                to_yaml, upgrade_dict)
from verirl.config.reference import markdown_reference
from verirl.config.schema import (ActivationDumpConfig, ActorConfig, AlgoConfig, Config, DataConfig, EvalConfig,
                                  FilterGroupsConfig, LogConfig, ModelConfig, MultiTurnConfig, OverlongBufferConfig,
                                  PreprocessConfig, RefConfig, RewardConfig, RolloutConfig, RolloutCorrectionConfig,
                                  SFTConfig, TrainerConfig, scale_rewards)
from verirl.config.values import validate
from verirl.core.errors import ConfigError

__all__ = ["ActivationDumpConfig", "ActorConfig", "AlgoConfig", "Config", "ConfigError", "DataConfig", "EvalConfig",
           "FilterGroupsConfig", "LogConfig", "ModelConfig", "MultiTurnConfig", "OverlongBufferConfig", "PreprocessConfig", "RECIPES",
           "RefConfig", "RewardConfig", "RolloutConfig", "RolloutCorrectionConfig", "SFTConfig", "TrainerConfig",
           "describe", "flatten", "load_config", "load_config_dict", "markdown_reference", "recipe_file",
           "scale_rewards", "to_dict", "to_yaml", "upgrade_dict", "validate"]
