"""A small deterministic WebShop for tests: the ``WebAgentTextEnv`` surface on six products.

It mirrors web_agent_site/envs/web_agent_text_env.py in text mode: ``reset(session=<goal index>)``,
``step(action) -> (observation, reward, done, info)``, ``get_available_actions()`` ->
``{has_search_bar, clickables}``, the ``observation`` / ``instruction_text`` attributes, pages
rendered as WebShop's simple text mode renders them (``' [SEP] '``-joined visible texts), a
``server`` holding the catalogue and the sessions that other instances may share
(``WebAgentTextEnv(server=...)``), ``session_prefix``, and a purchase scored from the product
type, attributes, options and price as WebShop's ``get_reward`` (simplified). Unlike WebShop it
has ``gold_actions(session)``: a winning path for each goal.

Use as ``env.text_env=fake_webshop:WebAgentTextEnv`` with this folder on ``sys.path``.
"""

from __future__ import annotations

import json
import os
import random
import string

__version__ = "0.0-fake"

SEP = " [SEP] "
PAGE_SIZE = 3  # products per results page (WebShop: 10)
END_BUTTON, NEXT_PAGE, PREV_PAGE, BACK_TO_SEARCH = "Buy Now", "Next >", "< Prev", "Back to Search"
SUB_PAGES = ("Description", "Features", "Reviews")

PRODUCTS = [
    {"asin": "B0CANDLE01", "title": "Lavender Soy Wax Candle, Long Lasting Jar", "price": 14.99,
     "category": "candle", "attributes": ["long lasting", "soy wax"],
     "options": {"size": ["8 oz", "16 oz"], "scent": ["lavender", "vanilla"]},
     "description": "A hand poured soy wax candle.", "features": "Burns for 60 hours.", "reviews": "Smells great."},
    {"asin": "B0CANDLE02", "title": "Vanilla Paraffin Candle Set of 3", "price": 9.50,
     "category": "candle", "attributes": ["gift set"], "options": {"scent": ["vanilla", "cinnamon"]},
     "description": "Three small candles.", "features": "Paraffin wax.", "reviews": "Burns fast."},
    {"asin": "B0SOCKS001", "title": "Men's Cotton Crew Socks, Moisture Wicking", "price": 19.99,
     "category": "socks", "attributes": ["moisture wicking", "cotton"],
     "options": {"color": ["black", "white", "grey"], "size": ["large", "medium"]},
     "description": "Six pairs of crew socks.", "features": "80% cotton.", "reviews": "Comfortable."},
    {"asin": "B0SOCKS002", "title": "Wool Hiking Socks for Women", "price": 24.00,
     "category": "socks", "attributes": ["wool", "cushioned"], "options": {"size": ["small", "medium"]},
     "description": "Merino wool socks.", "features": "Cushioned sole.", "reviews": "Warm."},
    {"asin": "B0TEA00001", "title": "Organic Green Tea Bags, 100 Count", "price": 8.75,
     "category": "tea", "attributes": ["organic", "caffeine"], "options": {"flavor": ["jasmine", "mint"]},
     "description": "Green tea from Japan.", "features": "100 bags.", "reviews": "Fresh taste."},
    {"asin": "B0TEA00002", "title": "Herbal Chamomile Tea, Caffeine Free", "price": 6.25,
     "category": "tea", "attributes": ["caffeine free", "organic"], "options": {},
     "description": "Calming chamomile.", "features": "20 bags.", "reviews": "Helps me sleep."},
]
BY_ASIN = {p["asin"]: p for p in PRODUCTS}

GOALS = [
    {"asin": "B0CANDLE01", "query": "lavender soy candle", "attributes": ["long lasting", "soy wax"],
     "options": {"size": "16 oz", "scent": "lavender"}, "price_upper": 20.0,
     "instruction_text": "i need a long lasting soy wax candle with lavender scent in 16 oz, and price lower than 20.00 dollars"},
    {"asin": "B0SOCKS001", "query": "cotton crew socks", "attributes": ["moisture wicking"],
     "options": {"color": "black", "size": "large"}, "price_upper": 30.0,
     "instruction_text": "i want moisture wicking cotton crew socks, black, size large, and price lower than 30.00 dollars"},
    {"asin": "B0TEA00002", "query": "chamomile tea", "attributes": ["caffeine free"], "options": {},
     "price_upper": 10.0,
     "instruction_text": "i am looking for caffeine free chamomile tea, and price lower than 10.00 dollars"},
    {"asin": "B0TEA00001", "query": "organic green tea", "attributes": ["organic"], "options": {"flavor": "mint"},
     "price_upper": 15.0,
     "instruction_text": "find me organic green tea in mint flavor, and price lower than 15.00 dollars"},
    {"asin": "B0SOCKS002", "query": "wool hiking socks", "attributes": ["wool", "cushioned"],
     "options": {"size": "small"}, "price_upper": 30.0,
     "instruction_text": "i need cushioned wool hiking socks in small, and price lower than 30.00 dollars"},
    {"asin": "B0CANDLE02", "query": "vanilla candle set", "attributes": ["gift set"], "options": {"scent": "cinnamon"},
     "price_upper": 12.0,
     "instruction_text": "i want a gift set of candles in cinnamon scent, and price lower than 12.00 dollars"},
    {"asin": "B0CANDLE01", "query": "soy candle", "attributes": ["soy wax"], "options": {"size": "8 oz", "scent": "vanilla"},
     "price_upper": 16.0,
     "instruction_text": "i need a soy wax candle, vanilla scent, 8 oz, and price lower than 16.00 dollars"},
    {"asin": "B0SOCKS001", "query": "crew socks", "attributes": ["cotton"], "options": {"color": "grey", "size": "medium"},
     "price_upper": 25.0,
     "instruction_text": "i am looking for grey cotton crew socks in medium, and price lower than 25.00 dollars"},
]


def get_reward(product: dict, goal: dict, options: dict[str, str]) -> float:
    """WebShop's reward, simplified: type x (attributes + options + price) / (n_attrs + n_opts + 1)."""
    r_type = 1.0 if product["category"] == BY_ASIN[goal["asin"]]["category"] else 0.1
    r_att = sum(a in product["attributes"] for a in goal["attributes"])
    r_opt = sum(options.get(k) == v for k, v in goal["options"].items())
    r_price = float(product["price"] <= goal["price_upper"])
    return r_type * (r_att + r_opt + r_price) / (len(goal["attributes"]) + len(goal["options"]) + 1)


class FakeServer:
    """The catalogue, the goals and the sessions (WebShop's ``SimServer``)."""

    created = 0  # servers built in this process (the adapters should share one)

    def __init__(self, num_products: int | None = None, file_path: str | None = None, **_):
        if file_path is not None and not os.path.exists(file_path):  # as WebShop's load_products
            raise FileNotFoundError(f"[Errno 2] No such file or directory: {file_path!r}")
        FakeServer.created += 1
        self.products = PRODUCTS[:num_products] if num_products else list(PRODUCTS)
        self.goals = [dict(g) for g in GOALS]
        self.user_sessions: dict[str, dict] = {}

    def search(self, keywords: list[str]) -> list[dict]:
        def score(p):
            words = set(" ".join([p["title"], p["category"], *p["attributes"]]).lower().replace(",", " ").split())
            return sum(k in words for k in keywords)

        hits = [(score(p), p["asin"], p) for p in self.products]
        return [p for s, _, p in sorted(hits, key=lambda h: (-h[0], h[1])) if s > 0]


class WebAgentTextEnv:
    """The text environment (WebShop's ``WebAgentTextEnv`` in ``observation_mode="text"``)."""

    def __init__(self, observation_mode: str = "html", server: FakeServer | None = None, **kwargs):
        if observation_mode != "text":
            raise ValueError(f"the fake WebShop renders text only, not {observation_mode!r}")
        self.observation_mode, self.kwargs = observation_mode, kwargs
        self.server = FakeServer(**kwargs) if server is None else server
        self.session_prefix = kwargs.get("session_prefix")
        self.session: str | None = None
        self.instruction_text = ""
        self.reset()

    # -- pages ------------------------------------------------------------------------------
    @property
    def _s(self) -> dict:
        return self.server.user_sessions[self.session]

    def _render(self) -> tuple[str, bool, list[str]]:
        """(text observation, has search bar, clickables) of the session's current page."""
        s, instr = self._s, self._s["goal"]["instruction_text"]
        page = s["page_name"]
        if page == "start":
            return SEP.join(["WebShop", "Instruction:", instr, "Search"]), True, ["search"]
        if page == "done":
            texts = ["Thank you for shopping with us!", "Your code:", "None", "(Paste it in your MTurk interface.)",
                     "Purchased", "asin", s["asin"], "options", json.dumps(s["options"]),
                     "Your score (min 0.0, max 1.0)", str(s["reward"])]
            return SEP.join(texts), False, []
        head = ["Instruction:", instr, BACK_TO_SEARCH]
        if page == "results":
            hits = self.server.search(s["keywords"])
            shown = hits[(s["page"] - 1) * PAGE_SIZE: s["page"] * PAGE_SIZE]
            buttons = ([PREV_PAGE] if s["page"] > 1 else []) + [NEXT_PAGE]
            texts = head + [f"Page {s['page']} (Total results: {len(hits)})", *buttons]
            for p in shown:
                texts += [p["asin"], p["title"], f"${p['price']:.2f}"]
            return SEP.join(texts), False, [b.lower() for b in [BACK_TO_SEARCH, *buttons]] + [p["asin"].lower() for p in shown]
        p = BY_ASIN[s["asin"]]
        if page == "item":
            texts, values = head + [PREV_PAGE], []
            for name, contents in p["options"].items():
                texts += [name, *contents]
                values += contents
            texts += [p["title"], f"Price: ${p['price']:.2f}", "Rating: N.A.", *SUB_PAGES, END_BUTTON]
            clickables = [b.lower() for b in [BACK_TO_SEARCH, PREV_PAGE, *SUB_PAGES, END_BUTTON]] + values
            return SEP.join(texts), False, clickables
        return SEP.join(head + [PREV_PAGE, p[page.lower()]]), False, [BACK_TO_SEARCH.lower(), PREV_PAGE.lower()]

    @property
    def observation(self) -> str:
        return self._render()[0]

    def get_available_actions(self) -> dict:
        _, bar, clickables = self._render()
        return {"has_search_bar": bar, "clickables": clickables}

    # -- the WebAgentTextEnv API ------------------------------------------------------------
    def reset(self, session=None, instruction_text=None):
        idx = session if isinstance(session, int) else None
        self.session = str(session) if session is not None else "".join(random.choices(string.ascii_lowercase, k=10))
        if self.session_prefix is not None:
            self.session = self.session_prefix + self.session
        sessions = self.server.user_sessions
        if self.session not in sessions:
            goal = self.server.goals[idx if idx is not None else random.randrange(len(self.server.goals))]
            sessions[self.session] = {"goal": goal}
        sessions[self.session].update(page_name="start", keywords=None, page=None, asin=None, options={},
                                      reward=None, done=False)
        self.instruction_text = f"Instruction: {self._s['goal']['instruction_text']}"
        return self.observation, None

    def step(self, action: str):
        _, bar, clickables = self._render()
        name, arg = _parse(action)
        arg = arg.lower() if arg is not None else None
        s, reward, done = self._s, 0.0, False
        if name == "search" and arg:  # as WebShop: a search works from any page
            s.update(page_name="results", keywords=arg.split(" "), page=1, asin=None, options={})
        elif name == "click" and arg in clickables and arg != "search":
            page = s["page_name"]
            if arg == END_BUTTON.lower():
                product = BY_ASIN[s["asin"]]
                reward = get_reward(product, s["goal"], s["options"])
                s.update(page_name="done", reward=reward, done=True)
                done = True
            elif arg == BACK_TO_SEARCH.lower():
                s.update(page_name="start")
            elif arg == NEXT_PAGE.lower() and page == "results":
                s["page"] += 1
            elif arg == PREV_PAGE.lower() and page == "results":
                s["page"] -= 1
            elif arg == PREV_PAGE.lower():
                s["page_name"] = "item" if page in SUB_PAGES else "results"
            elif arg in [p.lower() for p in SUB_PAGES]:
                s["page_name"] = next(p for p in SUB_PAGES if p.lower() == arg)
            elif page == "results":  # a product link
                s.update(page_name="item", asin=arg.upper())
            else:  # an option on the item page
                product = BY_ASIN[s["asin"]]
                option = next(k for k, vals in product["options"].items() if arg in vals)
                s["options"][option] = arg
        return self.observation, reward, done, None

    def gold_actions(self, session: int) -> list[str]:
        """A winning path for goal ``session``, written as the authors' demonstrations write it."""
        goal = self.server.goals[int(session)]
        hits = self.server.search(goal["query"].split(" "))
        position = [p["asin"] for p in hits].index(goal["asin"])
        actions = [f"search[{goal['query']}]"] + ["click[Next >]"] * (position // PAGE_SIZE)
        actions.append(f"click[{goal['asin']}]")  # product ids in upper case, as in the released data
        actions += [f"click[{v}]" for v in goal["options"].values()]
        return actions + ["click[Buy Now]"]

    def close(self):
        pass


class PlainWebAgentTextEnv(WebAgentTextEnv):
    """The fake without a gold path, as the real WebShop."""

    gold_actions = None


def _parse(action: str):
    """WebShop's parse_action: ``name[arg]`` or (action, None)."""
    import re

    m = re.match(r"(.+)\[(.+)\]", action)
    return (action, None) if m is None else m.groups()
