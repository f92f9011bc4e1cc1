"""What a model reads: the tokenizer, the shape data must have, and the generated corpus (the offline MM-IMDb-like set)."""
