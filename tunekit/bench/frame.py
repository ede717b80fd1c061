"""The DataFrame every microbenchmark returns, with what plotting needs in ``.attrs``."""
from __future__ import annotations


def frame(rows, bench: str, device=None, notes=None):
    import pandas as pd

    df = pd.DataFrame(rows)
    df.attrs.update(bench=bench, device=str(device) if device is not None else None,
                    notes=list(notes or []))
    return df
