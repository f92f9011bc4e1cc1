"""`advisor measure --plan`: a grid's cost before it runs, from past runs and a timed calibration."""
