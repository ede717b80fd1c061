"""Models: tunekit's demo GPT (`gpt`) and its training data (`data`)."""
