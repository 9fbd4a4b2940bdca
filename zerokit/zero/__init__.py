"""ZeRO (arXiv 1910.02054 §5): stages 1→3 partition optimizer states, gradients, parameters.

``flat_buffer`` (padded, sharded storage) → ``stage1`` → ``stage2_naive`` / ``stage2`` →
``stage3`` (with ``units`` and ``prefetch``); ``config`` maps DeepSpeed's
``zero_optimization`` keys, ``state_dict`` gathers the full model back; ``experts``: with expert
parallelism, the experts' units sharded over the ranks holding the same experts (edp), the dense ones over dp.
"""
