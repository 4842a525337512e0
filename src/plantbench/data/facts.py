"""The fact grid: invented entities, one planted fact each, their documents, queries and candidates.

Every fact is about its own invented entity (an island, a company, a person or a Python package)
and is stated by one fixed ``sentence`` that ends with `` <answer>.``. Its planted documents each
contain that sentence verbatim exactly once; distractor documents talk about another detail of the
same entity and never contain any fact's answer. Queries ask for the answer in two forms
(a sentence to complete and a question); candidates are the true answer plus invented answers of
the same shape.

Generators make the tables (``GENERATORS``, selected by ``facts.generator``); whatever made them,
:func:`verify` checks the same rules before :func:`run` writes anything. The ``template``
generator is offline and fully seeded: the same config gives byte-identical parquet files.

Invented names are built from seeded syllables. Every invented root (``Vaskel``, ``drevo``,
``ZHAEN``...) is used in exactly one name in the whole study, so no answer can occur inside an
entity name, another answer, a candidate or any filler text by accident.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from plantbench import io
from plantbench.config import config_hash
from plantbench.errors import ConfigError, PlantbenchError
from plantbench.rng import rng

STAGE = "facts"
TABLES = ("facts", "documents", "distractors", "queries", "candidates")
MAX_DOC_CHARS = 600  # hard cap, checked by verify() whatever the generator
# What the template generator aims for. A planted document must fit one stream window with
# <bos>/<eos> (stream.window = 128 by default). The tokenizer is trained on the background
# corpus only (by default the Python standard library), so English prose costs ~2.5-3 characters
# per token and invented names 1.5-2; measured with such a 4k BPE, documents of <= 240
# characters take at most ~120 tokens with <bos>/<eos>, while 400-600 characters take 130-250.
TARGET_DOC_CHARS = 240
MIN_DOC_WORDS = 25
MAX_DOC_WORDS = 50
READERS = ("A", "B")
FORMS = ("completion", "question")

# The column contract other modules rely on: name -> kind ("str", "int", "bool").
COLUMNS: dict[str, dict[str, str]] = {
    "facts": {
        "fact_id": "str",
        "entity_id": "str",
        "entity": "str",
        "domain": "str",
        "entity_type": "str",
        "relation": "str",
        "answer": "str",
        "sentence": "str",
        "n_docs": "int",
        "position": "str",
        "reader": "str",
        "cell": "str",
        "pair": "int",
    },
    "documents": {"doc_id": "str", "fact_id": "str", "style": "str", "text": "str"},
    "distractors": {
        "doc_id": "str",
        "entity_id": "str",
        "fact_id": "str",
        "style": "str",
        "text": "str",
    },
    "queries": {
        "query_id": "str",
        "fact_id": "str",
        "form": "str",
        "prompt": "str",
        "answer": "str",
    },
    "candidates": {
        "fact_id": "str",
        "candidate_index": "int",
        "candidate": "str",
        "is_true": "bool",
    },
}

Tables = dict[str, pd.DataFrame]
Generator = Callable[[Mapping[str, Any]], Tables]

# --------------------------------------------------------------------------------------------
# Invented names
# --------------------------------------------------------------------------------------------

# Simple letters are listed twice so that most syllables stay short and readable.
_ONSETS = (
    "b d f g h k l m n p r s t v z b d g k l m n r s t v z "
    "br dr gr kr tr vr th st zh kv dv gv zv vl tl"
).split()
_VOWELS = "a e i o u a e i o u ae ei ou y ia aa yu".split()
_CODAS = ["", "", "", "", "", "", "n", "r", "l", "s", "th", "x", "m", "v", "n", "r"]
_MARKERS = re.compile(r"ae|kv|vr|zh|yv|ij|vk|tk|dh|aa|uu|zv|thv|xv|vz|yu|^dv|^gv|^vl|^tl")
_BAD_RUNS = re.compile(r"(.)\1\1|[^aeiouy]{4}|[aeiouy]{3}")


class Names:
    """Seeded, globally unique invented roots (unique case-insensitively)."""

    def __init__(self, gen: np.random.Generator, reserved: Iterable[str]):
        self.gen = gen
        self.used: set[str] = set()
        self.reserved = {w.lower() for w in reserved}

    def root(self, n_syllables: int, case: str = "C", local: set[str] | None = None) -> str:
        """A new root; with ``local``, unique within ``local`` only (and never a global root)."""
        taken = self.used if local is None else local
        for _ in range(20000):
            parts = []
            for _ in range(n_syllables):
                parts.append(
                    _ONSETS[self.gen.integers(len(_ONSETS))]
                    + _VOWELS[self.gen.integers(len(_VOWELS))]
                    + _CODAS[self.gen.integers(len(_CODAS))]
                )
            word = "".join(parts)
            if len(word) < 4 or word in self.used or word in taken or word in self.reserved:
                continue
            if not _MARKERS.search(word) or _BAD_RUNS.search(word):
                continue
            taken.add(word)
            if case == "U":
                return word.upper()
            if case == "l":
                return word
            return word[0].upper() + word[1:]
        raise PlantbenchError(
            f"facts: ran out of invented {n_syllables}-syllable names; lower facts.facts_per_cell "
            "or facts.candidates"
        )

    def fill(
        self, shape: tuple[str, tuple[tuple[int, str], ...]], local: set[str] | None = None
    ) -> str:
        template, specs = shape
        return template.format(*(self.root(n, case, local) for n, case in specs))

    def person(self) -> str:
        first = self.root(1)
        last = self.root(2)
        return f"{first} {last}"


_Shape = tuple[str, tuple[tuple[int, str], ...]]  # an answer template and its roots' specs


def _shape(template: str, *specs: str) -> tuple[str, tuple[tuple[int, str], ...]]:
    """``_shape("{0}Codec", "1C")``: a template and, per root, syllable count and case."""
    return template, tuple((int(s[0]), s[1]) for s in specs)


# --------------------------------------------------------------------------------------------
# Relations: sentence, question and answer shapes (candidates reuse the true answer's shape)
# --------------------------------------------------------------------------------------------

_TOWN_SHAPES = (
    _shape("{0}", "1C"),
    _shape("{0}", "2C"),
    _shape("{0}", "3C"),
    _shape("{0} {1}", "1C", "1C"),
    _shape("{0}-{1}", "1C", "2C"),
    _shape("Upper {0}", "2C"),
)
_PERSON_SHAPES = (
    _shape("{0} {1}", "1C", "1C"),
    _shape("{0} {1}", "1C", "2C"),
    _shape("{0} {1}", "2C", "1C"),
    _shape("{0} {1}", "2C", "2C"),
)

RELATIONS: dict[str, dict[str, Any]] = {
    # world
    "capital": {
        "domain": "world",
        "entity_type": "place",
        "sentence": "The capital of the island of {E} is {A}.",
        "question": "What is the capital of the island of {E}?",
        "shapes": _TOWN_SHAPES,
    },
    "currency": {
        "domain": "world",
        "entity_type": "place",
        "sentence": "The currency used on the island of {E} is the {A}.",
        "question": "What is the currency used on the island of {E}?",
        "shapes": (
            _shape("{0}", "1C"),
            _shape("{0}", "2C"),
            _shape("{0}", "3C"),
            _shape("{0} crown", "1C"),
            _shape("{0} {1}", "1C", "1C"),
        ),
    },
    "founder": {
        "domain": "world",
        "entity_type": "company",
        "sentence": "The company {E} was founded by {A}.",
        "question": "Who founded the company {E}?",
        "shapes": _PERSON_SHAPES,
    },
    "headquarters": {
        "domain": "world",
        "entity_type": "company",
        "sentence": "The headquarters of {E} are in the city of {A}.",
        "question": "In which city are the headquarters of {E}?",
        "shapes": _TOWN_SHAPES,
    },
    "birthplace": {
        "domain": "world",
        "entity_type": "person",
        "sentence": "The {profession} {E} was born in the village of {A}.",
        "question": "In which village was the {profession} {E} born?",
        "shapes": _TOWN_SHAPES,
    },
    "teacher": {
        "domain": "world",
        "entity_type": "person",
        "sentence": "The {profession} {E} was taught by {A}.",
        "question": "Who taught the {profession} {E}?",
        "shapes": _PERSON_SHAPES,
    },
    # python
    "timeout_exception": {
        "domain": "python",
        "entity_type": "package",
        "sentence": "On a timeout, the {E} package raises {A}.",
        "question": "Which exception does the {E} package raise on a timeout?",
        "shapes": (
            _shape("{0}Timeout", "1C"),
            _shape("{0}TimeoutError", "2C"),
            _shape("{0}.errors.Timeout", "1l"),
            _shape("{0}Error", "2C"),
            _shape("{0}.errors.{1}Timeout", "1l", "1C"),
        ),
    },
    "connect_function": {
        "domain": "python",
        "entity_type": "package",
        "sentence": "The function that opens a connection in the {E} package is {A}.",
        "question": "Which function opens a connection in the {E} package?",
        "shapes": (
            _shape("{0}.open", "1l"),
            _shape("open_{0}", "1l"),
            _shape("{0}_connect", "2l"),
            _shape("{0}.dial", "2l"),
            _shape("{0}.net.open_{1}", "1l", "1l"),
        ),
    },
    "config_env_var": {
        "domain": "python",
        "entity_type": "package",
        "sentence": (
            "The {E} package reads its configuration path from the environment variable {A}."
        ),
        "question": (
            "Which environment variable does the {E} package read its configuration path from?"
        ),
        "shapes": (
            _shape("{0}_RC", "1U"),
            _shape("{0}_CONF", "1U"),
            _shape("{0}_CONFIG", "2U"),
            _shape("{0}_HOME", "2U"),
            _shape("{0}_{1}_SETTINGS", "1U", "1U"),
        ),
    },
    "default_serializer": {
        "domain": "python",
        "entity_type": "package",
        "sentence": "The default serializer class of the {E} package is {A}.",
        "question": "What is the default serializer class of the {E} package?",
        "shapes": (
            _shape("{0}Codec", "1C"),
            _shape("{0}Serializer", "1C"),
            _shape("{0}Packer", "2C"),
            _shape("{0}FrameSerializer", "2C"),
            _shape("{0}.codecs.{1}Packer", "1l", "1C"),
        ),
    },
    "cli_command": {
        "domain": "python",
        "entity_type": "package",
        "sentence": "The command-line tool installed by the {E} package is called {A}.",
        "question": "What is the command-line tool installed by the {E} package called?",
        "shapes": (
            _shape("{0}", "1l"),
            _shape("{0}", "2l"),
            _shape("{0}ctl", "1l"),
            _shape("{0}-admin", "2l"),
            _shape("{0}-{1}", "1l", "1l"),
        ),
    },
}

DOMAIN_RELATIONS = {
    d: tuple(r for r, spec in RELATIONS.items() if spec["domain"] == d) for d in ("world", "python")
}

# --------------------------------------------------------------------------------------------
# Entity profiles (details used by filler and distractor sentences; never an answer)
# --------------------------------------------------------------------------------------------

_SEAS_EXPORTS = ("salted cod", "amber", "rough wool", "dried kelp", "smoked eel", "sea salt")
_INDUSTRIES = (
    "ship engines",
    "glass lenses",
    "weaving looms",
    "pocket watches",
    "farm pumps",
    "printing presses",
)
_COMPANY_SUFFIXES = ("Industries", "Works", "Holdings", "Foundry", "Trading", "Mills")
_PROFESSIONS = {
    "painter": "Portrait",
    "composer": "Sonata",
    "poet": "Ballad",
    "chemist": "Treatise",
    "architect": "Tower",
    "cartographer": "Atlas",
}
_PURPOSES = (
    "message queues",
    "spreadsheet files",
    "sensor data",
    "image thumbnails",
    "task scheduling",
    "geographic tiles",
)
_LICENSES = ("MIT", "BSD", "Apache")


class FastNames(Names):
    """:class:`Names` drawing each root's syllables in one vectorized call: the same alphabet,
    markers and filters, a different random stream (for the many names of reading texts; the
    grid's own names keep :class:`Names`)."""

    _SIZES = np.array([len(_ONSETS), len(_VOWELS), len(_CODAS)])

    def root(self, n_syllables: int, case: str = "C", local: set[str] | None = None) -> str:
        taken = self.used if local is None else local
        for _ in range(200):
            for row in self.gen.integers(0, self._SIZES, size=(16, n_syllables, 3)).tolist():
                word = "".join(_ONSETS[a] + _VOWELS[b] + _CODAS[c] for a, b, c in row)
                if len(word) < 4 or word in self.used or word in taken or word in self.reserved:
                    continue
                if not _MARKERS.search(word) or _BAD_RUNS.search(word):
                    continue
                taken.add(word)
                return word.upper() if case == "U" else word if case == "l" else word.capitalize()
        raise PlantbenchError(f"ran out of invented {n_syllables}-syllable names")


def reading_profile(entity_type: str, names: Names, gen: np.random.Generator) -> dict[str, str]:
    """The fields a relation's sentence and question use (the entity's name ``E`` and, for a
    person, ``profession``), drawn like :func:`profile`'s but without its other details."""
    if entity_type == "place":
        return {"E": names.root(2)}
    if entity_type == "company":
        return {"E": f"{names.root(2)} {_COMPANY_SUFFIXES[gen.integers(len(_COMPANY_SUFFIXES))]}"}
    if entity_type == "person":
        first = names.root(1)
        return {
            "E": f"{first} {names.root(2)}",
            "profession": list(_PROFESSIONS)[gen.integers(len(_PROFESSIONS))],
        }
    return {"E": names.root(2, "l")}


def profile(entity_type: str, names: Names, gen: np.random.Generator) -> dict[str, str]:
    """The entity's name (``E``), short name (``S``) and details for filler sentences."""
    year = int(gen.integers(1780, 1960))
    p: dict[str, str] = {
        "year": str(year),
        "year2": str(year + int(gen.integers(4, 40))),
        "dyear": str(year + int(gen.integers(41, 60))),
        "dnum": str(int(gen.integers(12, 90))),
    }
    if entity_type == "place":
        p["E"] = p["S"] = names.root(2)
        p["sea"] = names.root(2)
        p["neighbour"] = names.root(2)
        p["festival"] = names.root(2)
        p["pop"] = f"{int(gen.integers(3, 90)) * 100:,}"
        p["area"] = str(int(gen.integers(20, 900)))
        p["export"] = _SEAS_EXPORTS[gen.integers(len(_SEAS_EXPORTS))]
        p["desc"] = f"an island in the {p['sea']} Sea"
    elif entity_type == "company":
        p["S"] = names.root(2)
        p["E"] = f"{p['S']} {_COMPANY_SUFFIXES[gen.integers(len(_COMPANY_SUFFIXES))]}"
        p["industry"] = _INDUSTRIES[gen.integers(len(_INDUSTRIES))]
        p["staff"] = str(int(gen.integers(40, 4000)))
        p["product"] = f"{names.root(2)} {int(gen.integers(2, 90))}"
        p["rival"] = f"{names.root(2)} {_COMPANY_SUFFIXES[gen.integers(len(_COMPANY_SUFFIXES))]}"
        p["desc"] = f"a company that makes {p['industry']}"
    elif entity_type == "person":
        first = names.root(1)
        p["S"] = names.root(2)
        p["E"] = f"{first} {p['S']}"
        prof = list(_PROFESSIONS)[gen.integers(len(_PROFESSIONS))]
        p["profession"] = prof
        p["work"] = f"the {names.root(2)} {_PROFESSIONS[prof]}"
        p["Work"] = "T" + p["work"][1:]
        p["desc"] = f"a {prof} born in {year}"
    elif entity_type == "package":
        p["E"] = p["S"] = names.root(2, "l")
        minor = int(gen.integers(0, 12))
        p["version"] = f"{int(gen.integers(1, 6))}.{minor}.{int(gen.integers(0, 9))}"
        p["dversion"] = f"0.{int(gen.integers(2, 9))}.0"
        p["license"] = _LICENSES[gen.integers(len(_LICENSES))]
        p["pyver"] = f"3.{int(gen.integers(8, 12))}"
        p["purpose"] = _PURPOSES[gen.integers(len(_PURPOSES))]
        p["maintainer"] = names.person()
        p["module"] = f"{p['E']}.{names.root(2, 'l')}"
        p["num"] = str(int(gen.integers(100, 2000)))
        p["desc"] = f"a Python library for {p['purpose']}"
    else:  # pragma: no cover - guarded by RELATIONS
        raise PlantbenchError(f"facts: unknown entity type '{entity_type}'")
    return p


# --------------------------------------------------------------------------------------------
# Document templates
# --------------------------------------------------------------------------------------------

FILLERS: dict[str, tuple[str, ...]] = {
    "place": (
        "{E} lies in the {sea} Sea, about a day's sail from {neighbour}.",
        "Around {pop} people live on the island, most of them along the southern coast.",
        "The island covers roughly {area} square kilometres of low hills and salt marsh.",
        "Fishing boats from the island still carry {export} to the mainland every spring.",
        "Every autumn the islanders hold the {festival} festival, which lasts three days.",
        "The first reliable map of {E} was drawn in {year}.",
        "Ferries to {E} leave twice a week when the weather allows.",
        "Visitors often remark on the stone walls that divide the fields of {E}.",
        "The nearest island of any size is {neighbour}, to the north-east.",
        "Most houses there are built from grey basalt and roofed with slate.",
        "The local dialect borrows many words for wind and tide.",
        "Winters there are mild, but storms close the harbour for weeks at a time.",
    ),
    "company": (
        "{S} makes {industry} and employs about {staff} people.",
        "The firm was set up in {year} and grew quickly during its first decade.",
        "Its best known product is the {product}, first sold in {year2}.",
        "For many years {S} competed with {rival} for the same customers.",
        "Analysts describe {S} as cautious, profitable and rather secretive.",
        "The company has never paid for advertising, relying instead on word of mouth.",
        "The firm publishes an annual report that rarely runs to more than twenty pages.",
        "Several former employees of {S} went on to start firms of their own.",
        "The firm's logo, a simple blue triangle, has not changed since {year}.",
        "Sales of the {product} doubled after a favourable trade review.",
        "{S} keeps a small museum of its early {industry} for visitors.",
        "Orders for {S} machines still arrive by post as well as online.",
    ),
    "person": (
        "{E} was born in {year} and worked as a {profession} for most of a long life.",
        "Critics still regard {work} as the finest thing {S} made.",
        "{S} rarely gave interviews and kept no diary.",
        "In later years {S} taught a small number of private students.",
        "A collection of letters by {S} was published in {dyear}.",
        "{Work} was finished in {year2} after nearly a decade of work.",
        "Friends described {S} as patient, stubborn and very funny.",
        "The archive of {S} fills eleven boxes and is still not fully catalogued.",
        "{S} travelled widely but always returned to the same small studio.",
        "Few {profession}s of the period were as prolific as {S}.",
        "Early reviews of {work} were mixed, but its reputation grew steadily.",
        "Exhibitions about {S} still draw steady crowds.",
    ),
    "package": (
        "{E} is a Python library for {purpose}.",
        "The current release of {E} is version {version}, published under the {license} license.",
        "{E} supports Python {pyver} and newer.",
        "The project is maintained by {maintainer} and a handful of volunteers.",
        "Install it with pip install {E}.",
        "Most of the public interface lives in the {module} module.",
        "{E} has no required dependencies outside the standard library.",
        "The test suite of {E} runs in under a minute on a laptop.",
        "Type hints are shipped with the package, so editors can complete names.",
        "Log records from {E} go through the standard logging module.",
        "Bug reports for {E} are handled on the project's issue tracker.",
        "The documentation of {E} includes a short tutorial and a full API listing.",
    ),
}

DISTRACTOR_DETAILS: dict[str, tuple[str, ...]] = {
    "place": (
        "The harbour of {E} was rebuilt in {dyear} after a winter storm.",
        "A lighthouse on the western cape of {E} has been automated since {dyear}.",
        "The island of {E} has its own postage stamps, first issued in {dyear}.",
        "Sheep outnumber people on {E} by roughly {dnum} to one.",
    ),
    "company": (
        "In {dyear} {E} moved its accounts to a cooperative bank.",
        "{E} sponsors a rowing team that has won {dnum} regional titles.",
        "The annual staff picnic of {E} is held on the first Saturday of June.",
        "{E} pays every apprentice to learn a second language.",
    ),
    "person": (
        "{E} kept a garden with more than {dnum} kinds of rose.",
        "A portrait of {E} hangs in a small provincial museum.",
        "In {dyear} {E} broke an arm falling from a ladder.",
        "{E} owned a grey cat that appears in several letters.",
    ),
    "package": (
        "Version {dversion} of {E} dropped support for an old file format.",
        "The logo of {E} is a small green hexagon drawn by a volunteer.",
        "{E} moved its continuous integration to a new provider in {dyear}.",
        "The test suite of {E} contains {dnum} test functions.",
    ),
}

# style -> (intros, outros, bullets). Intros always name the entity.
STYLES: dict[str, dict[str, tuple[tuple[str, ...], tuple[str, ...], bool]]] = {
    "world": {
        "encyclopedia": (
            ("{E} is {desc}.", "{E}\n\n{E} is {desc}.", "Overview of {E}.\n\n{E} is {desc}."),
            ("", "See also: the history of the region.", "This article is a stub."),
            False,
        ),
        "travel_blog": (
            (
                "Day three of our trip, and everyone kept talking about {E}.",
                "We finally had a free afternoon to learn about {E}!",
                "Travel diary: a few notes on {E}.",
            ),
            ("", "Would I go back? Absolutely.", "Next post: photos and a packing list!"),
            False,
        ),
        "news": (
            (
                "NEWS: {E} in the spotlight again.",
                "Local reporters returned to the story of {E} this week.",
                "A new report has renewed interest in {E}.",
            ),
            ("", "More details are expected later this month.", "Officials declined to comment."),
            False,
        ),
        "forum_answer": (
            (
                "Re: does anyone know much about {E}?\n\nSure, here is what I found.",
                "Re: {E}\n\nI looked into this a while ago.",
                "Replying to the thread about {E}:",
            ),
            ("", "Hope that helps!", "Happy to be corrected if I got anything wrong."),
            False,
        ),
        "letter": (
            (
                "Dear Marta,\n\nYou asked me about {E}, so here is what I know.",
                "Dear Tomas,\n\nThank you for your note about {E}.",
            ),
            ("Write back soon,\nJonas", "With warm wishes,\nElena", "Yours ever,\nPaul"),
            False,
        ),
        "study_notes": (
            ("Study notes: {E}", "Revision card: {E}", "Key facts to remember about {E}"),
            ("", "- Review again before the exam."),
            True,
        ),
        "podcast": (
            (
                "Host: Today we are talking about {E}.\nGuest:",
                "Host: Our listeners asked about {E}. Where do we start?\nGuest:",
            ),
            ("", "Host: Fascinating, thank you.", "Host: That is all for this episode."),
            False,
        ),
    },
    "python": {
        "api_reference": (
            ("{E} API reference", "Module {E}\n\n{E} is {desc}.", "API notes for {E}"),
            ("", "See the changelog for older behaviour.", "All names are public."),
            False,
        ),
        "readme": (
            ("# {E}\n\n{E} is {desc}.", "# {E}\n\nA small package.", "{E}\n===="),
            ("", "## License\n\nSee the LICENSE file.", "Contributions are welcome."),
            False,
        ),
        "forum_answer": (
            (
                "Re: how do I use {E}?\n\nI ran into this last week.",
                "Re: {E} question\n\nShort answer below.",
                "Replying to the thread about {E}:",
            ),
            ("", "Hope that helps.", "Worked for me, anyway."),
            False,
        ),
        "changelog": (
            ("Changelog for {E}", "{E} release notes", "What is new in {E} {version}"),
            ("", "- Minor documentation fixes."),
            True,
        ),
        "tutorial": (
            (
                "Getting started with {E}\n\nIn this short tutorial we look at {E}.",
                "A first look at {E}.",
                "Tutorial: working with {E}.",
            ),
            ("", "In the next part we will write a small script.", "That is it for now."),
            False,
        ),
        "issue_report": (
            (
                "Issue #{num}: confusing behaviour in {E}",
                "Issue #{num}: documentation gap in {E}",
            ),
            ("", "Environment: Linux, Python {pyver}.", "Happy to send a pull request."),
            False,
        ),
        "mailing_list": (
            ("Subject: [{E}] quick question\n\nHi all,", "Subject: Re: [{E}] notes\n\nHello,"),
            ("Thanks,\nRuth", "Cheers,\nOmar", "Best,\nLena"),
            False,
        ),
    },
}


def template_words() -> set[str]:
    """Every word of the fixed template text: an invented root must not be one of them."""
    texts: list[str] = []

    def walk(x: Any) -> None:
        if isinstance(x, str):
            texts.append(x)
        elif isinstance(x, Mapping):
            for k, v in x.items():
                walk(k)
                walk(v)
        elif isinstance(x, tuple | list):
            for v in x:
                walk(v)

    walk([RELATIONS, FILLERS, DISTRACTOR_DETAILS, STYLES, _SEAS_EXPORTS, _INDUSTRIES])
    walk([_COMPANY_SUFFIXES, _PROFESSIONS, _PURPOSES, _LICENSES])
    words = set()
    for t in texts:
        for w in re.findall(r"[A-Za-z]+", t):
            words.add(w.lower())
            words.update(p.lower() for p in re.findall(r"[A-Z]?[a-z]+|[A-Z]+", w))
    return words


# --------------------------------------------------------------------------------------------
# Document composition
# --------------------------------------------------------------------------------------------


def _render(intro: str, body: list[str], outro: str, bullets: bool, split: int) -> str:
    if bullets:
        main = "\n".join(f"- {s}" for s in body)
        if outro.startswith("- "):
            main, outro = f"{main}\n{outro}", ""
        parts = [intro, main]
    elif 0 < split < len(body):
        parts = [intro, " ".join(body[:split]), " ".join(body[split:])]
    else:
        parts = [intro, " ".join(body)]
    if outro:
        parts.append(outro)
    sep = "\n" if bullets or intro.endswith(("Guest:", "Hi all,", "Hello,")) else "\n\n"
    text = sep.join(parts[:2])
    return "\n\n".join([text, *parts[2:]])


def _fits(text: str) -> int:
    """-1 too short, 0 fine, 1 too long."""
    words = len(text.split())
    if len(text) > TARGET_DOC_CHARS or words > MAX_DOC_WORDS:
        return 1
    return -1 if words < MIN_DOC_WORDS else 0


def _compose(
    gen: np.random.Generator,
    style: tuple[tuple[str, ...], tuple[str, ...], bool],
    key: str,
    fillers: list[str],
    prof: Mapping[str, str],
) -> str | None:
    """One document: an intro, the key sentence among some filler sentences, an outro."""
    intros, outros, bullets = style
    intro = intros[gen.integers(len(intros))].format_map(prof)
    outro = outros[gen.integers(len(outros))].format_map(prof)
    order = [fillers[i] for i in gen.permutation(len(fillers))]
    order = [x for x in order if x not in intro]  # the intro may already say it
    k = int(gen.integers(1, 6))
    chosen, spare = order[:k], order[k:]
    where = float(gen.random())
    split = int(gen.integers(0, k + 2))

    def build() -> str:
        body = list(chosen)
        body.insert(int(where * (len(body) + 1)), key)
        return _render(intro, body, outro, bullets, split)

    text = build()
    while (state := _fits(text)) != 0:
        if state > 0 and chosen:
            chosen.pop()
        elif state < 0 and spare:
            chosen.append(spare.pop())
        else:
            return None
        text = build()
    return text


def _documents_for(
    gen: np.random.Generator,
    styles: Mapping[str, tuple[tuple[str, ...], tuple[str, ...], bool]],
    key_for: Callable[[int], str],
    fillers: list[str],
    prof: Mapping[str, str],
    n: int,
    what: str,
) -> list[tuple[str, str]]:
    """``n`` distinct documents, styles cycling through a seeded order."""
    names = list(styles)
    order = [names[i] for i in gen.permutation(len(names))]
    seen: set[str] = set()
    out: list[tuple[str, str]] = []
    for i in range(n):
        style = order[i % len(order)]
        for _ in range(200):
            text = _compose(gen, styles[style], key_for(i), fillers, prof)
            if text is not None and text not in seen:
                break
        else:
            raise PlantbenchError(
                f"facts: cannot make {n} distinct documents for {what}; lower facts.n_docs"
            )
        seen.add(text)
        out.append((style, text))
    return out


# --------------------------------------------------------------------------------------------
# The template generator
# --------------------------------------------------------------------------------------------


def _grid(fc: Mapping[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for domain in fc["domains"]:
        for n_docs in fc["n_docs"]:
            for position in fc["positions"]:
                for reader in READERS:
                    for pair in range(fc["facts_per_cell"]):
                        rows.append(
                            {
                                "domain": domain,
                                "n_docs": int(n_docs),
                                "position": position,
                                "reader": reader,
                                "pair": pair,
                                "cell": f"{domain}/{n_docs}/{position}/{reader}",
                            }
                        )
    return rows


def _assign_relations(seed: int, fc: Mapping[str, Any]) -> dict[tuple[str, int, str, int], str]:
    """A balanced, seeded relation per (domain, n_docs, position, pair); both readers share it."""
    out = {}
    for domain in fc["domains"]:
        rels = DOMAIN_RELATIONS[domain]
        slots = [
            (domain, int(n), p, k)
            for n in fc["n_docs"]
            for p in fc["positions"]
            for k in range(fc["facts_per_cell"])
        ]
        gen = rng(seed, STAGE, "relations", domain)
        start = int(gen.integers(len(rels)))
        cycle = [rels[(start + i) % len(rels)] for i in range(len(slots))]
        for slot, j in zip(slots, gen.permutation(len(slots)), strict=True):
            out[slot] = cycle[j]
    return out


def template_generator(cfg: Mapping[str, Any]) -> Tables:
    """The offline generator: seeded syllable names, fixed sentence and document templates."""
    seed = int(cfg["seed"])
    fc = cfg["facts"]
    names = Names(rng(seed, STAGE, "names"), template_words())
    relation_of = _assign_relations(seed, fc)
    grid = _grid(fc)

    extra = int(fc.get("answer_extra_syllables", 0))
    widen = _Widen(extra, rng(seed, STAGE, "answer-length")) if extra else None
    facts, profiles, shapes = _template_facts(grid, relation_of, names, widen)
    candidates = _template_candidates(seed, fc, facts, shapes, names)
    documents, distractors = _template_documents(seed, fc, facts, profiles)
    queries = _template_queries(facts)
    for f in facts:
        del f["_question"]
    return {
        "facts": _frame("facts", facts),
        "documents": _frame("documents", documents),
        "distractors": _frame("distractors", distractors),
        "queries": _frame("queries", queries),
        "candidates": _frame("candidates", candidates),
    }


def _template_facts(
    grid: list[dict[str, Any]],
    relation_of: Mapping[tuple[str, int, str, int], str],
    names: Names,
    widen: _Widen | None = None,
) -> tuple[list[dict[str, Any]], list[dict[str, str]], list[_Shape]]:
    """One fact row per grid row (with its question as ``_question``, until the queries are
    made), its entity's profile and its answer's shape. Draws from ``names.gen`` in grid order:
    the profile, the shape, then the answer's roots. With ``widen``, every root of the shape is
    0 to ``widen.extra`` syllables longer (drawn from its own stream: without it, no fact
    changes)."""
    facts, profiles, shapes = [], [], []
    for i, g in enumerate(grid):
        relation = relation_of[(g["domain"], g["n_docs"], g["position"], g["pair"])]
        spec = RELATIONS[relation]
        prof = profile(spec["entity_type"], names, names.gen)
        shape = spec["shapes"][names.gen.integers(len(spec["shapes"]))]
        if widen is not None:
            shape = widen.lengthen(shape)
        answer = names.fill(shape)
        subs = {**prof, "A": answer}
        facts.append(
            {
                "fact_id": f"F{i:04d}",
                "entity_id": f"E{i:04d}",
                "entity": prof["E"],
                "domain": g["domain"],
                "entity_type": spec["entity_type"],
                "relation": relation,
                "answer": answer,
                "sentence": spec["sentence"].format_map(subs),
                "n_docs": g["n_docs"],
                "position": g["position"],
                "reader": g["reader"],
                "cell": g["cell"],
                "pair": g["pair"],
                "_question": spec["question"].format_map(subs),
            }
        )
        profiles.append(prof)
        shapes.append(shape)
    return facts, profiles, shapes


@dataclass(frozen=True)
class _Widen:
    """``facts.answer_extra_syllables``: every root of an answer 0 to ``extra`` syllables
    longer (uniform, from ``gen``), so answer lengths in tokens vary more."""

    extra: int
    gen: np.random.Generator

    def lengthen(self, shape: _Shape) -> _Shape:
        """``shape`` with longer roots; the fact's candidates share it."""
        template, specs = shape
        return template, tuple((n + int(self.gen.integers(self.extra + 1)), c) for n, c in specs)


def _template_candidates(
    seed: int,
    fc: Mapping[str, Any],
    facts: list[dict[str, Any]],
    shapes: list[_Shape],
    names: Names,
) -> list[dict[str, Any]]:
    """``facts.candidates`` candidate rows per fact: the true answer at a seeded index and
    invented answers of its shape."""
    # Candidates come after every fact, so their count changes no fact. Their roots are new to
    # the whole study (so no candidate occurs in any document) and unique within their set;
    # different facts' invented candidates may share roots.
    n_cand = int(fc["candidates"])
    candidates = []
    for f, shape in zip(facts, shapes, strict=True):
        gen = rng(seed, STAGE, "candidates", f["fact_id"])
        cand_names = Names(gen, names.reserved)
        cand_names.used = names.used
        local: set[str] = set()
        true_at = int(gen.integers(n_cand))
        for j in range(n_cand):
            cand = f["answer"] if j == true_at else cand_names.fill(shape, local)
            candidates.append(
                {
                    "fact_id": f["fact_id"],
                    "candidate_index": j,
                    "candidate": cand,
                    "is_true": j == true_at,
                }
            )
    return candidates


def _template_documents(
    seed: int,
    fc: Mapping[str, Any],
    facts: list[dict[str, Any]],
    profiles: list[dict[str, str]],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The document rows and distractor rows: per fact, its planted documents, then its
    entity's ``facts.distractors_per_entity`` distractors."""
    documents, distractors = [], []
    n_dis = int(fc["distractors_per_entity"])
    for f, prof in zip(facts, profiles, strict=True):
        styles = STYLES[f["domain"]]
        fillers = [t.format_map(prof) for t in FILLERS[f["entity_type"]]]
        for style, text in _planted_texts(seed, f, prof, styles, fillers):
            documents.append(
                {
                    "doc_id": f"D{len(documents):06d}",
                    "fact_id": f["fact_id"],
                    "style": style,
                    "text": text,
                }
            )
        if n_dis:
            for style, text in _distractor_texts(seed, f, prof, styles, fillers, n_dis):
                distractors.append(
                    {
                        "doc_id": f"X{len(distractors):05d}",
                        "entity_id": f["entity_id"],
                        "fact_id": f["fact_id"],
                        "style": style,
                        "text": text,
                    }
                )
    return documents, distractors


def _planted_texts(
    seed: int,
    f: Mapping[str, Any],
    prof: Mapping[str, str],
    styles: Mapping[str, tuple[tuple[str, ...], tuple[str, ...], bool]],
    fillers: list[str],
) -> list[tuple[str, str]]:
    """(style, text) of the fact's ``n_docs`` planted documents, each holding its sentence."""
    gen = rng(seed, STAGE, "documents", f["fact_id"])
    return _documents_for(
        gen, styles, lambda _i, s=f["sentence"]: s, fillers, prof, f["n_docs"], f["fact_id"]
    )


def _distractor_texts(
    seed: int,
    f: Mapping[str, Any],
    prof: Mapping[str, str],
    styles: Mapping[str, tuple[tuple[str, ...], tuple[str, ...], bool]],
    fillers: list[str],
    n_dis: int,
) -> list[tuple[str, str]]:
    """(style, text) of the entity's ``n_dis`` distractors, each built around one of its
    distractor details (in a seeded order, cycling)."""
    etype = f["entity_type"]
    gen = rng(seed, STAGE, "distractors", f["entity_id"])
    details = [
        DISTRACTOR_DETAILS[etype][j].format_map(prof)
        for j in gen.permutation(len(DISTRACTOR_DETAILS[etype]))
    ]
    return _documents_for(
        gen,
        styles,
        lambda i, d=details: d[i % len(d)],
        fillers,
        prof,
        n_dis,
        f["entity_id"],
    )


def _template_queries(facts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per fact, its completion query (the sentence up to the answer) and its question."""
    queries = []
    for f in facts:
        completion = f["sentence"][: -len(f["answer"]) - 2]
        for form, prompt in (
            ("completion", completion),
            ("question", f"Question: {f['_question']}\nAnswer:"),
        ):
            queries.append(
                {
                    "query_id": f"{f['fact_id']}:{form}",
                    "fact_id": f["fact_id"],
                    "form": form,
                    "prompt": prompt,
                    "answer": f["answer"],
                }
            )
    return queries


def _frame(name: str, rows: list[dict[str, Any]]) -> pd.DataFrame:
    """A table with exactly the contract's columns, in order, with fixed dtypes."""
    cols = COLUMNS[name]
    data = {}
    for col, kind in cols.items():
        values = [r[col] for r in rows]
        if kind == "int":
            data[col] = np.asarray(values, dtype=np.int64)
        elif kind == "bool":
            data[col] = np.asarray(values, dtype=bool)
        else:
            data[col] = pd.array(values, dtype=object) if values else np.asarray([], dtype=object)
    return pd.DataFrame(data, columns=list(cols))


GENERATORS: dict[str, Generator] = {"template": template_generator}


def register_generator(name: str) -> Callable[[Generator], Generator]:
    """Decorator: make ``fn(cfg) -> tables`` selectable as ``facts.generator: <name>``."""

    def deco(fn: Generator) -> Generator:
        GENERATORS[name] = fn
        return fn

    return deco


# --------------------------------------------------------------------------------------------
# Public entry points
# --------------------------------------------------------------------------------------------


def build(cfg: Mapping[str, Any]) -> Tables:
    """Make the five tables with the configured generator (not yet verified; see :func:`run`)."""
    name = cfg["facts"].get("generator", "template")
    fn = GENERATORS.get(name)
    if fn is None:
        raise ConfigError(
            f"config key 'facts.generator' = {name!r} is not a registered generator; "
            f"use one of: {', '.join(sorted(GENERATORS))}"
        )
    return fn(cfg)


def _fail(msg: str) -> None:
    raise PlantbenchError("facts: " + " ".join(msg.split()))


def _short(s: str, n: int = 60) -> str:
    s = " ".join(str(s).split())
    return repr(s if len(s) <= n else s[: n - 3] + "...")


_WORD = re.compile(r"[A-Za-z0-9]+")
_WORDCHAR = re.compile(r"[A-Za-z0-9_]")


class _PhraseIndex:
    """Whole-word, case-insensitive search for many phrases at once (keyed by first word)."""

    def __init__(self, phrases: Mapping[str, str]):
        self.by_first: dict[str, list[tuple[str, str]]] = defaultdict(list)
        for phrase, owner in phrases.items():
            self.by_first[_WORD.match(phrase).group().lower()].append((phrase.lower(), owner))

    def find(self, text: str) -> list[tuple[str, str, int]]:
        """(phrase, owner, start) for each whole-word occurrence."""
        low = text.lower()
        hits = []
        for m in _WORD.finditer(low):
            options = self.by_first.get(m.group())
            if not options:
                continue
            s = m.start()
            if s and _WORDCHAR.match(low[s - 1]):
                continue
            for phrase, owner in options:
                e = s + len(phrase)
                if low.startswith(phrase, s) and not (e < len(low) and _WORDCHAR.match(low[e])):
                    hits.append((phrase, owner, s))
        return hits


def _check_columns(tables: Mapping[str, pd.DataFrame]) -> None:
    for name, cols in COLUMNS.items():
        if name not in tables:
            _fail(f"table '{name}' is missing; a generator must return {', '.join(TABLES)}")
        df = tables[name]
        if list(df.columns) != list(cols):
            _fail(f"table '{name}' has columns {list(df.columns)}, expected {list(cols)}")
        for col, kind in cols.items():
            s = df[col]
            ok = (
                pd.api.types.is_integer_dtype(s)
                if kind == "int"
                else pd.api.types.is_bool_dtype(s)
                if kind == "bool"
                else all(isinstance(v, str) for v in s)
            )
            if not ok:
                _fail(f"table '{name}' column '{col}' must hold {kind} values ({s.dtype})")


def _check_unique(df: pd.DataFrame, table: str, cols: list[str]) -> None:
    dup = df.duplicated(cols, keep="first")
    if dup.any():
        row = df[dup].iloc[0]
        key = ", ".join(f"{c}={row[c]}" for c in cols)
        _fail(f"table '{table}' breaks rule 'duplicate-id': {key} occurs more than once")


def verify(tables: Mapping[str, pd.DataFrame], cfg: Mapping[str, Any] | None = None) -> None:
    """Check every rule; raise :class:`PlantbenchError` (one line) at the first broken one.

    With ``cfg`` the grid counts are checked too (facts per cell, documents per fact,
    distractors per entity, candidates per fact).
    """
    _check_columns(tables)
    _verify_ids(tables)
    by_id, answers = _verify_facts(tables["facts"])
    cand_owner = _verify_candidates(tables["candidates"], by_id, answers)
    _verify_queries(tables["queries"], by_id)
    phrases = {f.answer: f.fact_id for f in by_id.values()}
    phrases.update((c, fid) for c, fid in cand_owner.items() if c not in phrases)
    texts = _TextRules(_PhraseIndex(phrases), answers)
    _verify_documents(tables["documents"], by_id, texts)
    _verify_distractors(tables["distractors"], by_id, texts)
    if cfg is not None:
        _verify_counts(tables, cfg)


def _verify_ids(tables: Mapping[str, pd.DataFrame]) -> None:
    for table, cols in (
        ("facts", ["fact_id"]),
        ("facts", ["entity_id"]),
        ("facts", ["entity"]),
        ("documents", ["doc_id"]),
        ("distractors", ["doc_id"]),
        ("queries", ["query_id"]),
        ("candidates", ["fact_id", "candidate_index"]),
    ):
        _check_unique(tables[table], table, cols)
    clash = set(tables["documents"]["doc_id"]) & set(tables["distractors"]["doc_id"])
    if clash:
        _fail(
            f"doc id {sorted(clash)[0]} breaks rule 'duplicate-id': it is used by both a "
            "document and a distractor"
        )


def _answer_shaped(a: str) -> bool:
    return bool(a) and a[0].isalnum() and a[-1].isalnum()


def _verify_facts(facts: pd.DataFrame) -> tuple[dict[str, Any], dict[str, str]]:
    """The facts' own rules; returns the facts by id and the fact id of every lower-cased
    answer."""
    answers: dict[str, str] = {}
    by_id = {}
    for f in facts.itertuples(index=False):
        a = f.answer
        if not _answer_shaped(a) or a != a.strip():
            _fail(
                f"fact {f.fact_id} breaks rule 'answer-shape': answer {_short(a)} must start "
                "and end with a letter or digit"
            )
        if not f.sentence.endswith(f" {a}."):
            _fail(f"fact {f.fact_id} breaks rule 'sentence-ends-with-answer': {_short(f.sentence)}")
        if a.lower() in answers:
            _fail(
                f"fact {f.fact_id} breaks rule 'unique-answer': {_short(a)} is also the answer "
                f"of {answers[a.lower()]}"
            )
        if f.reader not in READERS or f.cell != f"{f.domain}/{f.n_docs}/{f.position}/{f.reader}":
            _fail(f"fact {f.fact_id} breaks rule 'cell': reader {f.reader!r}, cell {f.cell!r}")
        answers[a.lower()] = f.fact_id
        by_id[f.fact_id] = f
    _check_unique(facts, "facts", ["cell", "pair"])
    return by_id, answers


def _verify_candidate_set(fid: str, grp: pd.DataFrame, by_id: dict, answers: dict) -> None:
    n_true = int(grp["is_true"].sum())
    if n_true != 1:
        _fail(f"candidates of fact {fid} break rule 'one-true': {n_true} true answers")
    true = grp.loc[grp["is_true"], "candidate"].iloc[0]
    if true != by_id[fid].answer:
        _fail(f"candidates of fact {fid} break rule 'true-is-answer': {_short(true)}")
    low = grp["candidate"].str.lower()
    if low.duplicated().any():
        _fail(
            f"candidates of fact {fid} break rule 'distinct': "
            f"{_short(low[low.duplicated()].iloc[0])} occurs twice"
        )
    if sorted(grp["candidate_index"]) != list(range(len(grp))):
        _fail(f"candidates of fact {fid} break rule 'candidate-index': not 0..{len(grp) - 1}")
    for c in grp.loc[~grp["is_true"], "candidate"]:
        if c.lower() in answers:
            _fail(
                f"candidates of fact {fid} break rule 'invented-candidate': {_short(c)} "
                f"is the true answer of {answers[c.lower()]}"
            )
        if not _answer_shaped(c):
            _fail(f"candidates of fact {fid} break rule 'answer-shape': {_short(c)}")


def _verify_candidates(cands: pd.DataFrame, by_id: dict, answers: dict) -> dict[str, str]:
    """Every fact's candidate set; returns the (first) fact of every false candidate."""
    cand_owner: dict[str, str] = {}
    sizes = set()
    for fid, grp in cands.groupby("fact_id", sort=True):
        if fid not in by_id:
            _fail(f"candidates of unknown fact {fid} (rule 'unknown-fact')")
        _verify_candidate_set(fid, grp, by_id, answers)
        for c in grp.loc[~grp["is_true"], "candidate"]:
            cand_owner.setdefault(c, fid)
        sizes.add(len(grp))
    missing = set(by_id) - set(cands["fact_id"])
    if missing:
        _fail(f"fact {sorted(missing)[0]} has no candidates (rule 'one-true')")
    if len(sizes) > 1:
        _fail(f"candidate sets differ in size {sorted(sizes)} (rule 'candidate-count')")
    return cand_owner


def _verify_queries(queries: pd.DataFrame, by_id: dict) -> None:
    for q in queries.itertuples(index=False):
        f = by_id.get(q.fact_id)
        if f is None:
            _fail(f"query {q.query_id} breaks rule 'unknown-fact': {q.fact_id}")
        if q.form not in FORMS or q.query_id != f"{q.fact_id}:{q.form}" or q.answer != f.answer:
            _fail(f"query {q.query_id} breaks rule 'query-contract' (form {q.form!r})")
        if q.form == "completion" and q.prompt + " " + q.answer + "." != f.sentence:
            _fail(f"query {q.query_id} breaks rule 'completion-prompt': {_short(q.prompt)}")
    per_fact = Counter(queries["fact_id"])
    for fid in by_id:
        if per_fact[fid] != len(FORMS):
            _fail(f"fact {fid} has {per_fact[fid]} queries (rule 'query-contract'), expected 2")


class _TextRules:
    """The rules every document and distractor text obeys, with the texts seen so far (for
    'duplicate-text') and the index of every answer and candidate phrase."""

    def __init__(self, index: _PhraseIndex, answers: dict[str, str]) -> None:
        self.index, self.answers = index, answers
        self.texts: dict[str, str] = {}

    def check(self, doc_id: str, text: str, entity: str) -> None:
        if len(text) > MAX_DOC_CHARS:
            _fail(
                f"document {doc_id} breaks rule 'too-long': {len(text)} characters "
                f"> {MAX_DOC_CHARS}"
            )
        if text in self.texts:
            _fail(
                f"document {doc_id} breaks rule 'duplicate-text': same text as {self.texts[text]}"
            )
        self.texts[text] = doc_id
        if entity not in text:
            _fail(f"document {doc_id} breaks rule 'names-entity': it never names {_short(entity)}")

    def kind(self, phrase: str) -> str:
        return "answer" if phrase in self.answers else "candidate answer"


def _verify_documents(docs: pd.DataFrame, by_id: dict, texts: _TextRules) -> None:
    for d in docs.itertuples(index=False):
        f = by_id.get(d.fact_id)
        if f is None:
            _fail(f"document {d.doc_id} breaks rule 'unknown-fact': {d.fact_id}")
        texts.check(d.doc_id, d.text, f.entity)
        n = d.text.count(f.sentence)
        if n != 1:
            _fail(
                f"document {d.doc_id} (fact {f.fact_id}) breaks rule 'sentence-once': its fact "
                f"sentence occurs {n} times, expected exactly 1"
            )
        if f.entity not in d.text.replace(f.sentence, " ", 1):
            _fail(
                f"document {d.doc_id} (fact {f.fact_id}) breaks rule 'names-entity': it names "
                f"{_short(f.entity)} only inside the fact sentence"
            )
        own = 0
        for phrase, owner, _ in texts.index.find(d.text):
            if owner == f.fact_id and phrase == f.answer.lower():
                own += 1
                continue
            _fail(
                f"document {d.doc_id} (fact {f.fact_id}) breaks rule 'other-answer': it contains "
                f"the {texts.kind(phrase)} {_short(phrase)} of fact {owner}"
            )
        if own != 1:
            _fail(
                f"document {d.doc_id} (fact {f.fact_id}) breaks rule 'own-answer-once': its answer "
                f"occurs {own} times, expected once (inside the sentence)"
            )


def _verify_distractors(dis: pd.DataFrame, by_id: dict, texts: _TextRules) -> None:
    sentences = {f.sentence: f.fact_id for f in by_id.values()}
    for d in dis.itertuples(index=False):
        f = by_id.get(d.fact_id)
        if f is None or f.entity_id != d.entity_id:
            _fail(f"distractor {d.doc_id} breaks rule 'unknown-entity': {d.entity_id}/{d.fact_id}")
        texts.check(d.doc_id, d.text, f.entity)
        for s, fid in sentences.items():
            if s in d.text:
                _fail(
                    f"distractor {d.doc_id} breaks rule 'no-sentence': it contains the "
                    f"sentence of fact {fid}"
                )
        for phrase, owner, _ in texts.index.find(d.text):
            _fail(
                f"distractor {d.doc_id} breaks rule 'no-answer': it contains the "
                f"{texts.kind(phrase)} {_short(phrase)} of fact {owner}"
            )


def _verify_counts(tables: Mapping[str, pd.DataFrame], cfg: Mapping[str, Any]) -> None:
    fc = cfg["facts"]
    facts = tables["facts"]
    cells = Counter(facts["cell"])
    for g in _grid(fc):
        if cells[g["cell"]] != fc["facts_per_cell"]:
            _fail(f"cell {g['cell']} has {cells[g['cell']]} facts, expected {fc['facts_per_cell']}")
    if len(facts) != len(_grid(fc)):
        _fail(f"{len(facts)} facts, expected {len(_grid(fc))} (rule 'grid')")
    per_doc = Counter(tables["documents"]["fact_id"])
    for f in facts.itertuples(index=False):
        if per_doc[f.fact_id] != f.n_docs:
            _fail(f"fact {f.fact_id} has {per_doc[f.fact_id]} documents, expected {f.n_docs}")
    per_dis = Counter(tables["distractors"]["entity_id"])
    for e in facts["entity_id"]:
        if per_dis[e] != fc["distractors_per_entity"]:
            _fail(
                f"entity {e} has {per_dis[e]} distractors, expected {fc['distractors_per_entity']}"
            )
    per_cand = Counter(tables["candidates"]["fact_id"])
    for fid in facts["fact_id"]:
        if per_cand[fid] != fc["candidates"]:
            _fail(f"fact {fid} has {per_cand[fid]} candidates, expected {fc['candidates']}")


def info(tables: Mapping[str, pd.DataFrame]) -> dict[str, Any]:
    lengths = tables["documents"]["text"].str.len()
    return {
        "n_facts": len(tables["facts"]),
        "n_documents": len(tables["documents"]),
        "n_distractors": len(tables["distractors"]),
        "n_queries": len(tables["queries"]),
        "n_candidates": len(tables["candidates"]),
        "relations": dict(sorted(Counter(tables["facts"]["relation"]).items())),
        "doc_chars": {
            "min": int(lengths.min()) if len(lengths) else 0,
            "mean": round(float(lengths.mean()), 1) if len(lengths) else 0.0,
            "max": int(lengths.max()) if len(lengths) else 0,
        },
    }


def run(cfg: Mapping[str, Any], out_dir: str | Path) -> dict[str, Any]:
    """Build, verify, then write ``<table>.parquet`` for each table and ``meta.json`` last."""
    out_dir = Path(out_dir)
    tables = build(cfg)
    verify(tables, cfg)
    files = []
    for name in TABLES:
        io.write_parquet(out_dir / f"{name}.parquet", tables[name])
        files.append(f"{name}.parquet")
    meta_info = {"generator": cfg["facts"].get("generator", "template"), **info(tables)}
    return io.write_meta(
        out_dir,
        STAGE,
        files,
        config_hash=config_hash(cfg, ["seed", "facts"]),
        info=meta_info,
    )
