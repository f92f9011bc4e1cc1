"""The files advisor ships: rules/ and kb/ from the top of the repository, installed as advisor.shipped.rules
and advisor.shipped.kb so that a non-editable install finds them (pyproject.toml maps the folders)."""
