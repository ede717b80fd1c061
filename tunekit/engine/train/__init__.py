"""The one training step (`step.TrainStep`), its precision contexts (`precision`) and the record
of its timed steps (`record.run_result`), shared by the Lab and every distributed rank.
"""
