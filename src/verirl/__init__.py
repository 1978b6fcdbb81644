"""verirl: GRPO with verifiable rewards, from a laptop CPU to a cluster."""
__version__ = "0.1.0"
