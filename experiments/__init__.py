"""The experiment app around ``recompute``: config schemas, one run → one record, the results store.

``run.py`` (Hydra) is the entry point; ``experiments.results.load()`` reads every record into pandas.
"""
