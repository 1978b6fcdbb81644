"""A run's life around training: the run directory, the checks before a run, the checkpoint files, the logs, trackers and the console, the signals, the watchdog."""
