"""The training loop, plain PyTorch without Ray: step, optimiser, checkpoints, out-of-memory retry."""
