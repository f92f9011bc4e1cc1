"""What a model reads: the tokenizer, the shape data must have, the generated corpus (the offline MM-IMDb-like
set), and the user's --data: resolved to local files and identified (`source.py`), a local folder as
`datasets` reads it, checked to read nothing from outside (`folder.py`), read as a family's columns and split
(`table.py`), its values checked before any cell reads them (`values.py`)."""
