"""The fastest configuration that fits, found within a time budget (a product over the Lab).

    >>> found = lab.autotune(budget_s=120)        # tokens/s; every trial is a real lab.run
    >>> found.toggles, found.verdict              # the winner, and how sure the search is
    >>> found.evidence                            # every candidate: tried, dropped, pruned, why
    >>> found.figure                              # plotly: tokens/s per candidate, noise bars

Modules: `run` (`autotune` and `LabTrials`: the search on a Lab, how it goes and ends); `options`
(every option, its default and check), `stages` (the stages, in the order ``core.toggles.SEARCH``
declares), `search` (trials, the noise band, the races), `result` (each `Candidate` and the
`AutotuneResult`).
"""
from tunekit.autotune.options import KEEP, OBJECTIVES, AutotuneOptions
from tunekit.autotune.result import BUSY_RETRIES, AutotuneResult, Candidate
from tunekit.autotune.run import LabTrials, autotune
from tunekit.autotune.search import TIEBREAK_ROUNDS, timed_steps

__all__ = ["autotune", "AutotuneOptions", "AutotuneResult", "Candidate", "LabTrials", "timed_steps",
           "OBJECTIVES", "KEEP", "BUSY_RETRIES", "TIEBREAK_ROUNDS"]
