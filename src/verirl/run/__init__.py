"""A run's life around training: the run directory, the checks before a run, the logs, trackers and the console, the watchdog."""
