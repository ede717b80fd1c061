"""The one training step (`step.TrainStep`), its precision contexts (`precision`), the record
of its timed steps (`record.run_result`), shared by the Lab and every distributed rank, and the
guard that undoes a run gone non-finite (`guard`: the Lab's runs and autotune's trials).
"""
