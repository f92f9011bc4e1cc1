"""`advisor measure --plan`: a grid's cost before it runs, from past runs and model shapes timed here."""
