"""tunekit inside other people's training loops: callbacks for the transformers `Trainer`
(`tunekit.integrations.transformers`) and Lightning's `Trainer` (`tunekit.integrations.lightning`),
each a `tunekit.Monitor` driven by the trainer's events. The top layer: it may use every other."""
