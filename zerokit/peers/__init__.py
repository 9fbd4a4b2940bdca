"""The implementations people would use instead, run as zerokit strategies in the same ledgers:
torch DDP and ZeroRedundancyOptimizer, FSDP2 and DeepSpeed."""
