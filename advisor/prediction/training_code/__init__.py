"""What an answer of `advisor fit` tells the user to run: the recipe (micro-batch, accumulation, learning rate:
recipe.py) and the code that trains with it (TrainingArguments or TRL's config, and the launch line: snippets.py)."""
