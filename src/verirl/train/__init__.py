"""Training: the actor (log-probs, the policy update), the GRPO loop, and SFT warm starts."""
