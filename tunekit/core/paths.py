"""Where tunekit writes: the platform's user folders, never the installed package. Pure: no torch.

    >>> data_dir()      # runs/, traces/, figures/   $TUNEKIT_DATA_DIR, else ~/.local/share/tunekit on Linux
    >>> cache_dir()     # calibrations, the corpus   $TUNEKIT_CACHE, else ~/.cache/tunekit on Linux

Linux (and any other POSIX system) follows the XDG base-directory spec: ``$XDG_DATA_HOME`` and
``$XDG_CACHE_HOME`` when set to an absolute path (the spec says to ignore a relative one), else
``~/.local/share`` and ``~/.cache``. macOS: ``~/Library/Application Support`` and ``~/Library/Caches``.
Windows: ``%LOCALAPPDATA%\\tunekit`` and ``%LOCALAPPDATA%\\tunekit\\Cache``. A source checkout uses
the same folders as an installed wheel: the package folder may be read-only, and a top-level
``data/`` in site-packages would clash with other packages.

Run logs grow by design (one file a day); traces, memory snapshots and chart files are capped:
``prune`` keeps the newest few and returns what it removed, for the caller to say so.
"""
from __future__ import annotations

import json
import ntpath
import os
import posixpath
import sys
import tempfile
from pathlib import Path

APP = "tunekit"
KEEP_TRACES = 20      # Chrome traces: a few MB each on a small model, more on a big one
KEEP_SNAPSHOTS = 5    # CUDA allocator snapshots: tens to hundreds of MB each
KEEP_FIGURES = 50     # charts written as HTML where no notebook shows them (plotly.js stored once beside)


def python_path() -> str:
    """This interpreter's sys.path as a PYTHONPATH, in its order: a child process (a rank, a Slurm job, a
    measuring child) imports what this process can (tunekit from a checkout, a model factory next to the
    notebook), and the standard library stays ahead of site-packages as it is here. A relative entry (the
    current folder) is made absolute: the child may start elsewhere."""
    return os.pathsep.join(os.path.abspath(p) if p else os.getcwd() for p in sys.path)


def user_dirs(platform: str | None = None, env=None, home=None) -> tuple[Path, Path]:
    """(data, cache): tunekit's folders under the platform's user directories, overrides ignored.

    Example: ``user_dirs("linux", {}, "/home/ada")`` is
    ``(Path("/home/ada/.local/share/tunekit"), Path("/home/ada/.cache/tunekit"))``."""
    platform = sys.platform if platform is None else platform
    env = os.environ if env is None else env
    home = Path.home() if home is None else Path(home)
    if platform == "darwin":
        return home / "Library" / "Application Support" / APP, home / "Library" / "Caches" / APP
    if platform == "win32":
        local = env.get("LOCALAPPDATA", "")
        base = Path(local) if ntpath.isabs(local) else home / "AppData" / "Local"
        return base / APP, base / APP / "Cache"
    data, cache = env.get("XDG_DATA_HOME", ""), env.get("XDG_CACHE_HOME", "")
    return ((Path(data) if posixpath.isabs(data) else home / ".local" / "share") / APP,
            (Path(cache) if posixpath.isabs(cache) else home / ".cache") / APP)


def _override(name: str) -> Path | None:
    value = os.environ.get(name, "")
    return Path(value).expanduser() if value else None  # set but empty: as if unset


def data_dir() -> Path:
    """What tunekit keeps for you: ``$TUNEKIT_DATA_DIR``, else the user data folder (``user_dirs``)."""
    return _override("TUNEKIT_DATA_DIR") or user_dirs()[0]


def cache_dir() -> Path:
    """What tunekit can rebuild (calibrations, the corpus): ``$TUNEKIT_CACHE``, else the user cache folder."""
    return _override("TUNEKIT_CACHE") or user_dirs()[1]


def runs_dir() -> Path:
    """The Lab's run logs, ``lab-YYYY-MM-DD.jsonl``: one a day, shared by every Lab of that day."""
    return data_dir() / "runs"


def traces_dir() -> Path:
    """Chrome traces (``*.json``) and CUDA allocator snapshots (``*.pickle``)."""
    return data_dir() / "traces"


def jobs_dir() -> Path:
    """Cluster jobs' folders (spec, batch script, progress, result, logs): every node of the
    cluster must see them (a shared home does; else pass ``Slurm(folder=...)``)."""
    return data_dir() / "jobs"


def figures_dir() -> Path:
    """Charts written as HTML files where no notebook can show them (a terminal, a script)."""
    return data_dir() / "figures"


def prune(folder, pattern: str, keep: int) -> list[Path]:
    """Delete all but the newest ``keep`` files of ``folder`` matching ``pattern``; returns the ones
    removed, oldest first. Only for folders tunekit owns (``traces_dir()``, ``figures_dir()``)."""
    if not isinstance(keep, int) or isinstance(keep, bool) or keep < 0:
        raise ValueError(f"keep must be an int >= 0, got {keep!r}")
    dated = []
    for p in Path(folder).glob(pattern):
        try:
            if p.is_file():
                dated.append((p.stat().st_mtime_ns, p.name, p))
        except OSError:  # removed by another process meanwhile
            continue
    removed = []
    for _, _, p in sorted(dated)[: max(len(dated) - keep, 0)]:
        try:
            p.unlink()
            removed.append(p)
        except OSError:  # gone already, or not ours to remove: it stays and is not reported
            continue
    return removed


def pruned_note(removed: list, what: str, keep: int) -> str | None:
    """The sentence that says what ``prune`` removed (None when nothing was).

    Example: ``"removed 2 older Chrome traces from /d/traces (tunekit keeps the newest 20): a.json, b.json"``."""
    if not removed:
        return None
    folder = Path(removed[0]).parent
    return (f"removed {len(removed)} older {what} from {folder} (tunekit keeps the newest {keep}): "
            + ", ".join(Path(p).name for p in removed))


def read_cache(name: str) -> dict:
    """The JSON object cached as ``name`` in `cache_dir`; {} when it is missing, unreadable or not an object."""
    try:
        with open(cache_dir() / name) as f:
            data = json.load(f)
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def write_cache(name: str, data: dict) -> None:
    """Write ``data`` as ``name`` in `cache_dir`: a private temp file, then an atomic rename."""
    folder = cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=1)
    os.replace(tmp, folder / name)
