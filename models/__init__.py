"""The published models advisor ships configs of, as package data (advisor.shipped.models): see index.toml."""
