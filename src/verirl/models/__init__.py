"""Loading models and tokenizers, the device layer, and the embedded tiny model."""
from verirl.models.device import resolve_device
from verirl.models.load import TINY_DIR, LoadedModel, load_model, save_hf, saved_format
from verirl.models.modes import eval_mode

__all__ = ["resolve_device", "TINY_DIR", "LoadedModel", "load_model", "save_hf", "saved_format", "eval_mode"]
