"""A Lab's build says what it is doing once it has taken over 2 s: `tunekit.Lab(preset="gpt2-124m")`
took 14 s with nothing shown on a busy 2-core machine (issue 39: any wait over ~2 s shows)."""
import re

import tunekit


def test_a_lab_s_build_shows_its_stages_and_ends_in_one_line(monkeypatch, capsys):
    from tunekit.view import progress

    stages = []
    real_at = progress.WaitProgress.at
    monkeypatch.setattr(progress, "SHOW_AFTER_S", 0.0)   # as if the build were long
    monkeypatch.setattr(progress.WaitProgress, "at", lambda self, stage, f=None: (stages.append(stage),
                                                                                  real_at(self, stage, f)))
    tunekit.Lab(preset="cpu-tiny", device="cpu")
    assert stages == ["building the model", "checking one step of it on two samples"]
    # stderr is no terminal here: the end line alone
    assert re.fullmatch(r"tunekit\.Lab: done in \d+\.\d s", capsys.readouterr().err.strip())
