"""eto-train: offline fine-tuning of LLM agents with ETO.

Data flow (one module per idea):
    envs -> prompting -> rollouts -> records/store -> training -> evaluation -> pipeline scripts
"""

__version__ = "0.1.0"
