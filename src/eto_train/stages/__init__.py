"""One module per pipeline stage, each with ``run(cfg)`` reading top to bottom like a recipe.

``eto-train <stage>`` (:mod:`eto_train.cli`) runs each under Hydra; ``stages.eto`` chains them,
and ``scripts/demo.sh`` (``make demo``, ``eto-train demo``) runs them one line each.
"""
