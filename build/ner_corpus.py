"""Sentences for the demo NER tagger: templates filled with names, each entity's span known.

Names come from Faker's locale data (installed offline with the package): people are first + last
names from the en_US, en_GB, de_DE, fr_FR and es_ES locales; locations are Faker's countries, US
states and German cities; organisations are Faker's company names ("Pearson-Kramer", "Reyes LLC")
plus "University of <state>" / "<city> <institution>" forms and a few well-known ones listed here;
MISC is nationalities, languages (Faker's) and events listed here. Every name list and the templates
are split in two by a fixed rule: a training part and a held-out part, so a test can measure the
tagger on templates and names it never saw.
"""
from __future__ import annotations

import hashlib
import re

ENTITY_TYPES = ("PER", "LOC", "ORG", "MISC")

# {PER}, {LOC}, {ORG}, {MISC} are slots; a template is held out when its index is in HELD_OUT_TEMPLATES.
TEMPLATES = [
    "{PER} went to {LOC}.",
    "{PER} went to {LOC} to meet {PER} at the {ORG}.",
    "{PER} works for {ORG} in {LOC}.",
    "{PER} was born in {LOC} and studied at the {ORG}.",
    "Yesterday {PER} flew from {LOC} to {LOC}.",
    "The {ORG} announced that {PER} will lead its office in {LOC}.",
    "{PER} speaks {MISC} and lives in {LOC}.",
    "According to {PER}, the {ORG} will open a new branch in {LOC} next year.",
    "{ORG} hired {PER} last week.",
    "In {LOC}, {PER} met the {MISC} delegation.",
    "{PER} and {PER} founded {ORG} in {LOC}.",
    "The {MISC} team beat {LOC} in the final.",
    "{PER} left {ORG} after ten years.",
    "Shares of {ORG} rose after {PER} spoke in {LOC}.",
    "{PER} moved to {LOC} with her family.",
    "{PER} moved to {LOC} with his family.",
    "A spokesman for {ORG} said {PER} was not in {LOC} that day.",
    "The report by {ORG} names {PER} as its author.",
    "{PER} visited {LOC}, {LOC} and {LOC} in one week.",
    "Thousands watched the {MISC} in {LOC}.",
    "{PER} will attend the {MISC} in {LOC}.",
    "Police in {LOC} questioned {PER} on Monday.",
    "{PER} told reporters that {ORG} had no plans to leave {LOC}.",
    "The {MISC} writer {PER} won a prize.",
    "{PER}, a lawyer from {LOC}, joined {ORG}.",
    "We drove from {LOC} to {LOC} in a day.",
    "{ORG} and {ORG} signed a deal in {LOC}.",
    "Did {PER} really say that about {ORG}?",
    "{PER} teaches {MISC} at the {ORG}.",
    "The road to {LOC} was closed after the storm.",
    "My friend {PER} lives near {LOC}.",
    "{PER} is the new chief of {ORG}.",
    "The {MISC} embassy in {LOC} was closed.",
    "{PER} and {PER} married in {LOC} last summer.",
    "Officials from {ORG} arrived in {LOC} on Friday.",
    "{PER} said the weather in {LOC} was fine.",
    "Last year {ORG} sold its factory in {LOC} to {ORG}.",
    "She met {PER} at a conference in {LOC}.",
    "The {MISC} government praised {ORG}.",
    "{PER} scored twice for {LOC} on Sunday.",
    "Tickets for the {MISC} sold out in {LOC}.",
    "{PER} has been president of {ORG} since 2019.",
    "After the meeting {PER} returned to {LOC}.",
    "Neither {PER} nor {PER} answered questions from {ORG}.",
    "The company {ORG} is based in {LOC}.",
    "{PER} wrote a book about {LOC}.",
    "Many {MISC} tourists visit {LOC} every year.",
    "{PER} thanked the staff of {ORG}.",
    "Flights between {LOC} and {LOC} were cancelled.",
    "{PER} grew up in {LOC} before joining {ORG}.",
    "It was {PER} who called {ORG} from {LOC}.",
    "The mayor of {LOC}, {PER}, opened the new bridge.",
    "A {MISC} court fined {ORG} on Tuesday.",
    "{PER} spent the winter in {LOC}.",
    "Students at the {ORG} protested in {LOC}.",
    "{PER} gave a talk on {MISC} poetry.",
    "The train from {LOC} arrived late.",
    "{ORG} said {PER} had resigned.",
    "Fans of {PER} waited outside the hotel in {LOC}.",
    "{PER} is a {MISC} singer who lives in {LOC}.",
]
HELD_OUT_TEMPLATES = frozenset(range(4, len(TEMPLATES), 6))  # every sixth, from the fifth on

KNOWN_ORGS = ["United Nations", "European Union", "World Bank", "Red Cross", "World Health Organization",
              "International Monetary Fund", "Supreme Court", "National Gallery", "Central Bank", "Parliament",
              "Federal Reserve", "Senate", "Olympic Committee", "British Museum", "Royal Navy", "Labour Party"]
INSTITUTIONS = ["University", "Hospital", "Museum", "Bank", "Orchestra", "Council", "Institute", "Library"]
NATIONALITIES = ["German", "French", "British", "American", "Italian", "Spanish", "Dutch", "Swedish", "Polish",
                 "Chinese", "Japanese", "Indian", "Brazilian", "Mexican", "Canadian", "Australian", "Russian",
                 "Turkish", "Greek", "Irish", "Korean", "Egyptian", "Nigerian", "Kenyan", "Danish", "Norwegian",
                 "Austrian", "Swiss", "Belgian", "Portuguese", "Argentine", "Chilean"]
EVENTS = ["Olympics", "World Cup", "Tour de France", "Wimbledon", "Super Bowl", "Champions League", "Oscars",
          "Nobel Prize", "Eurovision Song Contest", "Christmas", "Easter", "Ramadan", "Davis Cup", "Grand Prix"]


def _held_out(name: str) -> bool:
    """One name in five, chosen by a hash of the name (stable across runs and list orders)."""
    return hashlib.sha256(name.encode()).digest()[0] % 5 == 0


def _unique(items) -> list[str]:
    return sorted({i.strip() for i in items if i and i.strip() and re.fullmatch(r"[\w .,'&-]+", i.strip())})


def name_lists() -> dict[str, list[str]]:
    """Every candidate name per type (the first-name and last-name pools for PER)."""
    import importlib

    firsts, lasts = [], []
    for locale in ("en_US", "en_GB", "de_DE", "fr_FR", "es_ES"):
        person = importlib.import_module(f"faker.providers.person.{locale}").Provider
        firsts += list(getattr(person, "first_names", []))
        lasts += list(getattr(person, "last_names", []))
    address_en = importlib.import_module("faker.providers.address.en").Provider
    address_us = importlib.import_module("faker.providers.address.en_US").Provider
    address_de = importlib.import_module("faker.providers.address.de_DE").Provider
    states = list(address_us.states)
    places = list(address_en.countries) + states + list(address_de.cities)
    person_en = importlib.import_module("faker.providers.person.en").Provider
    return {"first": _unique(firsts), "last": _unique(lasts), "LOC": _unique(places), "state": _unique(states),
            "MISC": _unique(NATIONALITIES + EVENTS + list(person_en.language_names))}


class NameSource:
    """Draws names of one split ("train" or "held_out") with a numpy Generator."""

    def __init__(self, split: str):
        held = split == "held_out"
        lists = name_lists()
        self.pools = {key: [n for n in names if _held_out(n) == held] for key, names in lists.items()}
        self.known_orgs = [n for n in KNOWN_ORGS if _held_out(n) == held]

    def draw(self, kind: str, rng) -> str:
        pick = lambda key: self.pools[key][int(rng.integers(len(self.pools[key])))]  # noqa: E731
        if kind == "PER":
            if rng.random() < 0.15:
                return pick("last") if rng.random() < 0.5 else pick("first")
            return f"{pick('first')} {pick('last')}"
        if kind == "ORG":
            form = rng.random()
            if form < 0.2 and self.known_orgs:
                return self.known_orgs[int(rng.integers(len(self.known_orgs)))]
            if form < 0.35:
                return f"University of {pick('state')}"
            if form < 0.5:
                return f"{pick('LOC')} {INSTITUTIONS[int(rng.integers(len(INSTITUTIONS)))]}"
            suffix = ["Inc", "LLC", "Group", "Ltd", "and Sons", "PLC", "GmbH", "Partners"][int(rng.integers(8))]
            if form < 0.8:
                return f"{pick('last')} {suffix}"
            return f"{pick('last')}-{pick('last')}"
        return pick(kind)


def sentences(split: str, count: int, seed: int) -> list[tuple[str, list[tuple[int, int, str]]]]:
    """(text, [(start, end, type)]) pairs: templates and names of one split."""
    import numpy as np

    rng = np.random.default_rng(seed)
    held = split == "held_out"
    templates = [t for i, t in enumerate(TEMPLATES) if (i in HELD_OUT_TEMPLATES) == held]
    source = NameSource(split)
    out = []
    for _ in range(count):
        template = templates[int(rng.integers(len(templates)))]
        text, spans, pos = "", [], 0
        for match in re.finditer(r"\{(PER|LOC|ORG|MISC)\}", template):
            text += template[pos:match.start()]
            name = source.draw(match.group(1), rng)
            spans.append((len(text), len(text) + len(name), match.group(1)))
            text += name
            pos = match.end()
        out.append((text + template[pos:], spans))
    return out


def flair_sentence(text: str, spans):
    """A flair Sentence (segtok-tokenized, as the pipeline tokenizes) with its entities as "ner" labels."""
    from flair.data import Sentence

    sentence = Sentence(text)
    for start, end, kind in spans:
        tokens = [i for i, t in enumerate(sentence.tokens) if start <= t.start_position and t.end_position <= end]
        if not tokens or sentence.tokens[tokens[0]].start_position != start or \
                sentence.tokens[tokens[-1]].end_position != end:
            raise ValueError(f"entity {text[start:end]!r} in {text!r} does not fall on token boundaries")
        sentence[tokens[0]:tokens[-1] + 1].add_label("ner", kind)
    return sentence
