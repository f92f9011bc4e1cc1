"""What a model reads: the tokenizer, the shape data must have, the generated corpus (the offline MM-IMDb-like
set), and a local --data folder as `datasets` reads it, checked to read nothing from outside (`folder.py`)."""
