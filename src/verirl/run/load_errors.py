"""How a checkpoint file that fails to load is reported: the gist of the library's error
(`reason`) and the one-paragraph `CheckpointError` naming the file (`damaged`), shared by the
one-file format (`verirl.run.checkpoint`) and the sharded one (`verirl.run.shards`)."""
from __future__ import annotations

from pathlib import Path

from verirl.core.errors import CheckpointError


def reason(e: BaseException) -> str:
    """The gist of a library's error, short, for a one-line message. Never passes on torch's advice
    to retry with ``weights_only=False`` (that would unpickle whatever the file holds)."""
    text = str(e).strip()
    if "weights_only" in text or "Weights only" in text:
        parts = text.split("WeightsUnpickler error:")
        detail = " ".join(parts[1].split("Check the documentation")[0].split())[:120] if len(parts) > 1 else ""
        return ("it holds something other than the tensors and numbers verirl saves"
                + (f" (torch: {detail})" if detail else "") + ", so it was not unpickled")
    if not text:
        return type(e).__name__
    first = text.splitlines()[0]
    if len(first) > 160 and ". " in first:
        first = first.split(". ")[0]
    return f"{type(e).__name__}: {first[:200].rstrip('.')}"


def damaged(file: Path, what: str, e: BaseException) -> CheckpointError:
    return CheckpointError(f"{file}: cannot load {what}: {reason(e)}. The checkpoint is damaged: resume from "
                           f"another one (trainer.resume=RUN_DIR/checkpoints/step_N) or give the run directory "
                           f"to use its newest good one.")
