"""The engine of `advisor fit`: a training step traced under fake tensors (no memory), on one rank or sharded."""
