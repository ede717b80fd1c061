"""The training lab: one live model trained under toggles you flip (`lab.Lab`, a façade: how it is
made and checked is `build`, its two searches as it shows them `searches`), a single-process
run (`run`) or one over ranks (`distributed`, through `tunekit.parallel`), the fit check that
refuses a step before allocating (`fit`), the max-batch search (`maxbatch`), the run log
(`runlog`), ``lab.plan`` (`plan`), what a Lab has recorded (`results`) and how it is shown: the
dashboard (`dashboard`) and its charts (`plots`); ``lab.expect`` (`expect`), and a learner's guess
set against it and the measurement (`guess`).
"""
from tunekit.core.toggles import ToggleError, Toggles
from tunekit.lab.guess import check_guess
from tunekit.lab.runlog import repeat_agreement

__all__ = ["Toggles", "ToggleError", "repeat_agreement", "check_guess"]
