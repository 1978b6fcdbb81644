"""Our advantages and loss equal TRL's GRPOTrainer on the same tensors (a real trainer, a real model)."""
import pytest
import torch

trl = pytest.importorskip("trl")


@pytest.fixture(scope="module")
def trl_setup(tmp_path_factory):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from verirl.models import load_model

    tiny = load_model("tiny")  # TRL patches the model's forward: give it its own copy
    captured = []

    def reward_len(completions, **kwargs):  # deterministic rewards with ties and spread within groups
        r = [float((3 * i) % 5) + 0.1 * len(str(c)) % 1 for i, c in enumerate(completions)]
        captured.append(r)
        return r

    rows = [{"prompt": [{"role": "user", "content": "12 + 34 = ? Reply <think> </think> <answer> \\boxed{} </answer>."}]},
            {"prompt": [{"role": "user", "content": "A bus has 23 seats. How many seats in 4 buses? Reply <think> "
                                                    "</think> <answer> \\boxed{} </answer>."}]}]
    args = GRPOConfig(output_dir=str(tmp_path_factory.mktemp("trl")), per_device_train_batch_size=8,
                      num_generations=4, max_completion_length=24, beta=0.04, report_to=[], use_cpu=True, bf16=False,
                      logging_steps=1, temperature=1.0, epsilon=0.2, epsilon_high=0.28,
                      use_bias_correction_kl=False)  # plain k3, as veRL and the GRPO paper
    trainer = GRPOTrainer(model=tiny.model, reward_funcs=[reward_len], args=args,
                          train_dataset=Dataset.from_list(rows * 4), processing_class=tiny.tokenizer)
    torch.manual_seed(0)
    inputs = [r for r in rows for _ in range(4)]
    out = trainer._generate_and_score_completions(inputs)
    return trainer, out, captured[-1], tiny


def test_advantages_match_trl(trl_setup):
    from verirl.algo import grpo_advantages
    _, out, rewards, _ = trl_setup
    ours = grpo_advantages(torch.tensor(rewards), group_size=4, epsilon=1e-4)  # TRL adds 1e-4 to the std
    assert torch.allclose(ours, out["advantages"].float(), atol=1e-6), (ours, out["advantages"])
    assert ours.abs().sum() > 0  # the case is not degenerate


@pytest.mark.parametrize("loss_type,agg", [("bnpo", "token-mean"), ("grpo", "seq-mean-token-mean")])
def test_loss_matches_trl(trl_setup, loss_type, agg):
    from verirl.algo import aggregate, clipped_policy_loss, kl_penalty
    from verirl.train.actor import response_logprobs
    from verirl.types import Rollout

    trainer, out, _, tiny = trl_setup
    trainer.loss_type = loss_type
    model = tiny.model
    model.eval()
    inputs = dict(out)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        roll = Rollout(inputs["prompt_ids"], inputs["prompt_mask"], inputs["completion_ids"],
                       inputs["completion_mask"], torch.ones(len(inputs["prompt_ids"]), dtype=torch.bool))
        logp_now, _, _ = response_logprobs(model, roll)
        w = logp_now.shape[1]
        # an off-policy old policy and a reference that differ from the current one, so clipping and KL matter
        noise = 0.3 * torch.randn(inputs["completion_ids"].shape, generator=gen)
        inputs["old_per_token_logps"] = torch.zeros_like(noise)
        inputs["old_per_token_logps"][:, :w] = logp_now + noise[:, :w]
        inputs["ref_per_token_logps"] = torch.zeros_like(noise)
        inputs["ref_per_token_logps"][:, :w] = logp_now - noise[:, :w].flip(0)
        inputs["advantages"] = torch.linspace(-1.5, 1.5, len(noise))
        theirs = trainer._compute_loss(model, inputs)

        logp, _, mask = response_logprobs(model, roll)
        old = inputs["old_per_token_logps"][:, :w]
        ref = inputs["ref_per_token_logps"][:, :w]
        pg, _ = clipped_policy_loss(logp, old, inputs["advantages"], 0.2, 0.28)
        ours = aggregate(pg, mask, agg) + 0.04 * aggregate(kl_penalty(logp, ref, "low_var_kl"), mask, agg)
    assert float(ours) == pytest.approx(float(theirs), abs=1e-5, rel=1e-5)
