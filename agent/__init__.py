"""teye agent: samples the host, the GPUs and training phases; see DESIGN notes in README."""

__version__ = "0.1.0"
