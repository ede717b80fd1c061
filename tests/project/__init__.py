"""Repository-level checks: the layers and folder map, imports, docs, README, notebooks, install, tools."""
