"""What a person sees: rich renderables for the terminal (views, the scatter plot), pictures (Vega-Lite
charts through Altair) and `advisor report`'s static site."""
