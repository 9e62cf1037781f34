"""One module per pipeline stage, each with ``run(cfg)`` reading top to bottom like a recipe.

``scripts/<stage>.py`` wraps each in a Hydra main; ``stages.eto`` chains them.
"""
