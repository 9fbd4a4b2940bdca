"""What every parallelism runs on: the launcher, the rank context and its device mesh, the
communication and memory ledgers, zerokit's ring collectives and the timeline tracer.

Importing this package imports ``torch.distributed.nn.functional`` (2 ms), so that it is
imported before any process group exists: its functions take ``group=group.WORLD`` as a
default argument, evaluated at import, and imported later — by torch._dynamo, which the
first ``torch.optim`` optimizer imports, e.g. inside ``zerokit.initialize`` after the
user's ``init_process_group`` — ten defaults hold the world group. ``destroy_process_group``
then cannot free it: its gloo worker threads run on into interpreter exit, where one that
releases a finished collective's tensor needs the GIL, gets ``pthread_exit`` from the
finalizing interpreter and aborts the process ("terminate called without an active
exception"). :mod:`.mesh` holds its groups weakly for the same reason.
"""
try:
    import torch.distributed.nn.functional  # noqa: F401  (see above: before any process group exists)
except ImportError:  # a torch without distributed support: there are no process groups to keep alive
    pass
