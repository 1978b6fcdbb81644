"""Commands around training: the planner (`verirl plan`), the alignment toolkit (`verirl convert-config`, `doctor`, `compare-runs`, ...) and the report."""
