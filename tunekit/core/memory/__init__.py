"""Memory anatomy of training from sizes alone (pure): `estimate` (estimate_memory for any model
shape), `gpt_count` (the demo GPT tensor by tensor), `hf_count` (transformers families)."""
