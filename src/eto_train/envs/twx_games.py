"""The TextWorldExpress games and the action forms each accepts: plain data, no import, so the config schema
(``pretrain.data.settings`` games) and the pretraining transcripts can name the games without loading the
adapter (envs/textworld_express.py, which imports the schema for its own section)."""

# Action templates shown to the agent in the system prompt (from the games' valid-action lists).
ACTION_FORMS: dict[str, list[str]] = {
    "coin": ["move <direction>", "open door to <direction>", "take coin", "look around", "inventory"],
    "mapreader": ["move <direction>", "read map", "take <object>", "put <object> in <container>",
                  "task", "look around", "inventory"],
    "sorting": ["take <object>", "put <object> in box", "look around", "inventory"],
    "arithmetic": ["take <object>", "read <object>", "put <object> in box", "look around", "inventory"],
    "twc": ["move <direction>", "open <container>", "take <object>", "put <object> in <container>",
            "look around", "inventory"],
    "cookingworld": ["move <direction>", "open <container>", "take <object>", "read cookbook",
                     "slice/dice/chop <object>", "cook <object> in <appliance>", "prepare meal",
                     "eat meal", "look around", "inventory"],
    "simonsays": ["<verb> <object>"],
    "peckingorder": ["read instructions book", "take <object>", "look around", "inventory"],
}
