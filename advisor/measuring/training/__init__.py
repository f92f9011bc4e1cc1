"""One cell trained for real: the trainer, its data and held-out evaluation, what it measures and reports."""
