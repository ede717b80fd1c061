"""Per-step measurement inside the user's own loop (`Monitor`) and where its figures go (`sinks`).
Engine layer."""
