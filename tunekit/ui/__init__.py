"""What a person sees: the ``%%gpuprofile`` magic, ``tunekit.experiment``, charts, the dashboard,
HTML reports and the ``tunekit`` command. Parse, call the engine or a meter, display; never measures.
"""
