"""What one cell trains with, as configuration: the run config, the optimizers and the memory strategies."""
