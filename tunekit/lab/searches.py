"""The Lab's two searches as ``lab.find_max_batch_size`` and ``lab.autotune`` run them: the search
itself (`tunekit.lab.maxbatch`, `tunekit.autotune`), shown going by `tunekit.view.progress` unless
``verbose=False``.
"""
from __future__ import annotations

from tunekit.core.setting import Setting
from tunekit.core.validate import flag
from tunekit.lab.expect_line import stop_expecting


def find_max_batch(lab, start, limit, memory_budget_bytes, budget_fraction, progress, snapshot_on_oom,
                   budget_s, verbose, s: Setting):
    """``lab.find_max_batch_size``'s body: the search of the Setting ``s`` (made at its edge),
    shown unless ``verbose`` is False."""
    from tunekit.lab.maxbatch import search as find
    stop_expecting(lab)   # its trials measure peaks: no fake step planned beside them
    args = (lab, s, start, limit, memory_budget_bytes, budget_fraction)
    if not flag("verbose", verbose):
        return find(*args, progress, snapshot_on_oom, budget_s)
    from tunekit.view.progress import SearchProgress  # the view that shows it, as lab.run's
    with SearchProgress("find_max_batch_size", budget_s, progress) as shown:
        shown.result = find(*args, shown.tried, snapshot_on_oom, budget_s, trying=shown.trying)
    return shown.result


def autotune(lab, budget_s, objective, progress, verbose, options: dict):
    """``lab.autotune``'s body: the search (``options`` are `tunekit.autotune.autotune`'s keywords,
    ``start`` the Setting made at its edge), shown unless ``verbose`` is False."""
    from tunekit.autotune import autotune as search_on

    stop_expecting(lab)   # its trials are timed: no fake step planned beside them
    if options.get("on") is not None and options.get("trials") is None:   # each trial a job on the cluster
        from tunekit.lab.cluster import ClusterTrials
        options = dict(options, trials=ClusterTrials(lab, options["on"], options["warmup"],
                                                     options["memory_budget_bytes"], budget_s))
    def search(tick):
        return search_on(lab, budget_s, objective, progress=tick, **options)
    if not flag("verbose", verbose) or (progress is not None and not callable(progress)):
        return search(progress)   # quiet, or a bad progress the options' check refuses
    from tunekit.view.progress import SearchProgress
    with SearchProgress("autotune", budget_s, progress) as shown:
        shown.result = search(shown.tick)
    return shown.result
