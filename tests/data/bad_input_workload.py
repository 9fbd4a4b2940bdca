"""A small workload for the CLI cases of tests/app/test_bad_input.py
(``--model tests/data/bad_input_workload.py:work``)."""
import zerokit


def work():
    return zerokit.mlp((4, 8, 2), batch_size=4)
