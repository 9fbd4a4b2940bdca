"""Data parallelism (ZeRO §2.1): every rank holds the whole model and averages gradients.

``naive`` (one all-reduce per tensor) → ``bucketed`` (a few large calls) → ``overlap``
(buckets launched from gradient hooks during backward). ``buckets`` lays the gradients
out; ``reducer`` is the end-of-backward bookkeeping that ``ddp`` and ZeRO share.
"""
