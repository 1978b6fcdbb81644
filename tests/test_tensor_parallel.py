"""Tensor parallelism of the decoder (`verirl.models.parallel`) with two real gloo processes, the tiny
model in float32: the log-probs of the same tokens and every parameter's gradient (the output layer
vocabulary-parallel, tied to the embedding) against the unsharded model in one process; and the shapes
that cannot split, refused with their arithmetic."""
from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from verirl.core.errors import ConfigError

RANK = r"""
import json, sys
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from verirl.core.ops.head_logprobs import head_logprobs, vocab_parallel_head_logprobs
from verirl.models import load_model
from verirl.models.parallel import head_shard, tensor_parallel

torch.set_num_threads(1)
dist.init_process_group("gloo")
mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("tp",))["tp"]
ids = torch.randint(1, 366, (2, 24), generator=torch.Generator().manual_seed(0))
labels, hidden_size = ids[:, 1:].reshape(-1), 128


def log_probs(model, tp):
    h = model.get_decoder()(input_ids=ids).last_hidden_state[:, :-1].reshape(-1, hidden_size)
    if not tp:
        return head_logprobs(h, model.get_output_embeddings().weight, labels, temperature=0.8, with_entropy=True)
    w, start = head_shard(model)
    return vocab_parallel_head_logprobs(h, w, labels, start, mesh.get_group(), temperature=0.8, with_entropy=True)


ref = load_model("tiny", device="cpu").model
lp_ref, ent_ref = log_probs(ref, False)
(lp_ref.sum() + 0.1 * ent_ref.sum()).backward()
model = tensor_parallel(load_model("tiny", device="cpu").model, mesh)
lp, ent = log_probs(model, True)
(lp.sum() + 0.1 * ent.sum()).backward()
worst = {}
grads_ref = dict(ref.named_parameters())
for name, p in model.named_parameters():
    g = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
    want = grads_ref[name].grad
    worst[name] = float((g - want).abs().max() / want.abs().max())
sharded = sorted(n for n, p in model.named_parameters() if hasattr(p, "to_local"))
print("RESULT", json.dumps({"logp": float((lp - lp_ref).abs().max() / lp_ref.abs().max()),
                            "entropy": float((ent - ent_ref).abs().max() / ent_ref.abs().max()),
                            "grads": worst, "sharded": sharded}), flush=True)
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_tensor_parallel_tiny_equals_one_process(tmp_path):
    import json

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    procs = [subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, env={**os.environ, "RANK": str(r), "WORLD_SIZE": "2", "OMP_NUM_THREADS": "1",
                                              "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
             for r in range(2)]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    for out in outs:
        result = json.loads(next(line for line in out.splitlines() if line.startswith("RESULT")).split(" ", 1)[1])
        assert result["logp"] < 1e-5 and result["entropy"] < 1e-5, result
        assert len(result["grads"]) == 4 * 12 + 2 and max(result["grads"].values()) < 1e-5, result["grads"]
        assert len(result["sharded"]) == 4 * 10 + 1  # each layer: 7 weights, the q, k, v biases; the tied embedding
        assert "model.embed_tokens.weight" in result["sharded"] and "model.norm.weight" not in result["sharded"]


@pytest.mark.parametrize("tp,words", [
    (3, "does not divide the model's num_attention_heads=4 (4 / 3 = 1.33)"),
    (4, "does not divide the model's num_key_value_heads=2 (2 / 4 = 0.5)"),
])
def test_shapes_that_cannot_split_are_refused_with_the_arithmetic(tp, words):
    from verirl.models.load import model_config
    from verirl.models.parallel import check_tensor_parallel

    config = model_config("tiny", {})
    check_tensor_parallel(config, 2)
    with pytest.raises(ConfigError, match=words.replace("(", r"\(").replace(")", r"\)")):
        check_tensor_parallel(config, tp)


def test_a_family_without_a_plan_is_named():
    from transformers import GPT2Config

    from verirl.models.parallel import check_tensor_parallel

    with pytest.raises(ConfigError, match="model_type 'gpt2' has no tensor-parallel plan.*llama, qwen2, qwen3, mistral"):
        check_tensor_parallel(GPT2Config(), 2)
