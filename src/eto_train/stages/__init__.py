"""One module per pipeline stage, each with ``run(cfg)`` reading top to bottom like a recipe.

``eto-train <stage>`` (:mod:`eto_train.cli`) runs each under Hydra; ``stages.eto`` and
``stages.demo`` chain them.
"""
