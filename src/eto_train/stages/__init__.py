"""One module per pipeline stage, each with ``run(cfg)`` reading top to bottom like a recipe.

``eto-train <stage>`` (:mod:`eto_train.cli`) runs each under Hydra, and ``scripts/demo.sh``
(``make demo``, ``eto-train demo``) runs them one line each. The ETO stage is a package:
:mod:`eto_train.stages.eto.loop` (``eto`` and ``eto-iter``) and its steps ``eto/explore.py``,
``eto/pairs.py`` and ``eto/dpo.py``, which take an iteration's policy and folder, not a config alone.
"""
