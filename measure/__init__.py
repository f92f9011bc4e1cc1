"""The evidence side: models, data, optimizers, strategies, monitor and grid runner. Imports torch lazily."""
