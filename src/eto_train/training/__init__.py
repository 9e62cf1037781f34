"""Trainers: behavior cloning (TRL SFTTrainer) and, later, masked multi-turn DPO."""
