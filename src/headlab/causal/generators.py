"""Built-in tasks: clean/corrupt prompt pairs for behaviours with known circuits.

Each generator is ``f(tokenizer, n, *, seed=0, part="discovery") -> list[Prompt]``: ``n``
prompts, the same for the same arguments. ``part`` is ``"discovery"`` (find a circuit) or
``"held-out"`` (test it): the two draw from disjoint names, words or nouns (the even and the
odd positions of the built-in lists, split before the tokenizer filters them, so that a name is
in the same part for every tokenizer), so that a circuit found on one is measured on what it
never saw. Every prompt returned has a clean and a corrupt
side of the same token length with ``tokenizer`` (a draw that is not is drawn again), so
:func:`~headlab.causal.tasks.encode_task` never refuses one.

- :func:`ioi`: indirect object identification (Wang et al. 2022), corrupted to their ABC
  distribution.
- :func:`induction`: a repeated sequence of random words (Olsson et al. 2022).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from headlab.causal.tasks import Prompt, prefix_ids
from headlab.datasets.ioi import (
    HELD_OUT_PLACES,
    HELD_OUT_TEMPLATES,
    HELD_OUT_THINGS,
    NAMES,
    PLACES,
    TEMPLATES,
    THINGS,
)
from headlab.errors import InputError

PARTS = ("discovery", "held-out")
#: draws tried per prompt before a generator gives up on the tokenizer
TRIES = 64

#: common words for :func:`induction`; those the tokenizer keeps whole (with and without a
#: leading space) are the alphabet of the random sequences
WORDS = (
    "time", "year", "people", "way", "day", "man", "thing", "woman", "life", "child", "world",
    "school", "state", "family", "student", "group", "country", "problem", "hand", "part",
    "place", "case", "week", "company", "system", "program", "question", "work", "number",
    "night", "point", "home", "water", "room", "mother", "area", "money", "story", "fact",
    "month", "lot", "right", "study", "book", "eye", "job", "word", "business", "issue",
    "side", "kind", "head", "house", "service", "friend", "father", "power", "hour", "game",
    "line", "end", "member", "law", "car", "city", "name", "team", "minute", "idea", "kid",
    "body", "back", "parent", "face", "others", "level", "office", "door", "health", "person",
    "art", "war", "history", "party", "result", "change", "morning", "reason", "research",
    "girl", "guy", "moment", "air", "teacher", "force", "education", "food", "river", "tree",
    "stone", "music", "paper", "table", "window", "king", "road", "field", "horse", "bird",
)  # fmt: skip


def _check_part(part: str) -> int:
    """0 for discovery, 1 for held-out: the offset of the part's half of a list."""
    if part not in PARTS:
        raise InputError(f"part must be one of {', '.join(PARTS)}, got {part!r}")
    return PARTS.index(part)


def _ids(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _whole(tokenizer: Any, text: str) -> int | None:
    """The one token of ``text``, or ``None`` when it takes several or is the unknown token."""
    ids = _ids(tokenizer, text)
    unknown = getattr(tokenizer, "unk_token_id", None)
    return ids[0] if len(ids) == 1 and ids[0] != unknown else None


def _fits(tokenizer: Any, p: Prompt) -> bool:
    """What :func:`encode_task` asks of a prompt: equal lengths, different compared tokens."""
    if len(prefix_ids(tokenizer, p.clean)) != len(prefix_ids(tokenizer, p.corrupt)):
        return False
    answer, distractor = _ids(tokenizer, p.answer), _ids(tokenizer, p.distractor)
    return bool(answer) and bool(distractor) and answer[0] != distractor[0]


def _too_few(needs: str, kept: str) -> InputError:
    """Why a built-in task cannot be drawn with this tokenizer, and what to do instead."""
    return InputError(
        f"--task {needs}; this model's tokenizer keeps {kept} whole (it cuts words into "
        "smaller pieces, as a character-level one does), so the built-in prompts cannot be "
        "drawn: give your own with --prompts FILE.jsonl (docs/causal.md, Tasks and the metric)"
    )


def _draw(
    tokenizer: Any, n: int, task: str, make: Callable[[random.Random, int], Prompt | None],
    seed: int,
) -> list[Prompt]:  # fmt: skip
    """``n`` prompts ``make(rng, i)``, each drawn again (at most :data:`TRIES` times) while it
    is ``None`` or does not :func:`_fits` the tokenizer."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise InputError(f"{task}: n must be a whole number of at least 1, got {n!r}")
    rng, out = random.Random(seed), []
    for i in range(n):
        for _ in range(TRIES):
            p = make(rng, i)
            if p is not None and _fits(tokenizer, p):
                out.append(p)
                break
        else:
            raise InputError(
                f"{task}: no prompt in {TRIES} draws fits this tokenizer (clean and corrupt of "
                "equal token length, answer and distractor of different first tokens)"
            )
    return out


def ioi(tokenizer: Any, n: int, *, seed: int = 0, part: str = "discovery") -> list[Prompt]:
    """Indirect object identification (Wang et al. 2022, "Interpretability in the Wild").

    clean: ``When Mary and John went to the store, John gave a drink to``; answer `` Mary``
    (the indirect object, IO), distractor `` John`` (the subject, S); the metric is then
    ``logit(IO) - logit(S)``. Even prompts are ABBA (IO first), odd ones BABA. corrupt: Wang et
    al.'s ABC distribution, the three name slots filled with three distinct names other than IO
    and S (``When Anna and Paul went to the store, Tom gave a drink to``): same template,
    place and object, but no clue to which name is the IO.

    The names are :data:`~headlab.pruning.tasks.NAMES` at even positions (discovery) or odd
    ones (held-out) that the tokenizer keeps whole after a space; clean and corrupt of a prompt
    use names of its part only. The held-out part has its own templates, places and objects
    too (:data:`~headlab.datasets.ioi.HELD_OUT_TEMPLATES`): sentences discovery never saw.

    Raises:
        InputError: fewer than 5 such names in the part (IO, S and three for ABC).
    """
    offset = _check_part(part)
    names = [name for name in NAMES[offset::2] if _whole(tokenizer, " " + name) is not None]
    if len(names) < 5:
        raise _too_few(
            "ioi needs 5 names the tokenizer keeps as one token after a space (IO, S and 3 for "
            "the corrupted prompt)",
            f"{len(names)} of the {len(NAMES[offset::2])} {part} names",
        )

    templates, places, things = (
        (TEMPLATES, PLACES, THINGS)
        if offset == 0
        else (HELD_OUT_TEMPLATES, HELD_OUT_PLACES, HELD_OUT_THINGS)
    )

    def make(rng: random.Random, i: int) -> Prompt:
        io, s, *others = rng.sample(names, 5)
        order = "ABBA" if i % 2 == 0 else "BABA"
        a, b = (io, s) if order == "ABBA" else (s, io)
        template = i % len(templates)
        place, thing = rng.choice(places), rng.choice(things)

        def text(a: str, b: str, s: str) -> str:
            return templates[template].format(a=a, b=b, s=s, place=place, thing=thing)

        return Prompt(
            clean=text(a, b, s),
            corrupt=text(*others),
            answer=" " + io,
            distractor=" " + s,
            meta={"io": io, "s": s, "template": template, "order": order,
                  "corrupt_names": others},
        )  # fmt: skip

    return _draw(tokenizer, n, "ioi", make, seed)


def induction(
    tokenizer: Any, n: int, *, seed: int = 0, part: str = "discovery", length: int = 10
) -> list[Prompt]:
    """Repeated random words (Olsson et al. 2022, "In-context Learning and Induction Heads").

    clean: ``length`` distinct random words ``w1 .. wL`` followed by their first ``k`` again
    (``k`` random in ``[2, length - 2]``); answer: `` w(k+1)``, the word an induction head copies
    (attend to the token after the earlier ``wk``, copy it). corrupt: the first half drawn
    afresh (``u1 .. uL``, none of the ``w``), then the same ``w1 .. wk``: the end of the prompt
    repeats nothing, so nothing says what comes next. distractor: `` wj``, a later word of the
    first half (``j`` in ``k+2 .. L``). The metric is read at the last token, in the repeated
    half.

    In the corrupted prompt neither answer nor distractor occurs, so a model scores them
    about alike there; on the clean prompt both occur once in the first half, and only a model
    that induces prefers the answer.

    Words are :data:`WORDS` at even positions (discovery) or odd ones (held-out) that the
    tokenizer keeps as one token both with and without a leading space (the first word has
    none); a draw whose text does not re-tokenize to exactly one token a word is drawn again.

    Raises:
        InputError: ``length`` below 4, or fewer than ``2 * length`` usable words.
    """
    offset = _check_part(part)
    if isinstance(length, bool) or not isinstance(length, int) or length < 4:
        raise InputError(f"induction: length must be a whole number of at least 4, got {length!r}")
    words = [
        w for w in WORDS[offset::2]
        if _whole(tokenizer, w) is not None and _whole(tokenizer, " " + w) is not None
    ]  # fmt: skip
    need = 2 * length  # the L words of the first half and L fresh ones
    if len(words) < need:
        raise _too_few(
            f"induction needs {need} words the tokenizer keeps as one token with and without a "
            f"space before ({length} repeated and {length} fresh ones)",
            f"{len(words)} of the {len(WORDS[offset::2])} {part} words",
        )

    def one_each(words: list[str]) -> list[int | None]:
        """The ids the words must keep in the text: one each (the first without a space)."""
        return [_whole(tokenizer, words[0])] + [_whole(tokenizer, " " + w) for w in words[1:]]

    def make(rng: random.Random, i: int) -> Prompt | None:
        k = rng.randint(2, length - 2)
        drawn = rng.sample(words, 2 * length)
        seq, other = drawn[:length], drawn[length:]  # w1 .. wL; u1 .. uL
        j = rng.randint(k + 1, length - 1)  # 0-based: seq[k] is the answer
        clean_words, corrupt_words = seq + seq[:k], other + seq[:k]
        clean, corrupt = " ".join(clean_words), " ".join(corrupt_words)
        # one token a word, as drawn: the repeat must be the very ids of the first copy
        if _ids(tokenizer, clean) != one_each(clean_words):
            return None
        if _ids(tokenizer, corrupt) != one_each(corrupt_words):
            return None
        return Prompt(
            clean=clean, corrupt=corrupt, answer=" " + seq[k], distractor=" " + seq[j],
            meta={"length": length, "k": k, "distractor_position": j + 1},
        )  # fmt: skip

    return _draw(tokenizer, n, "induction", make, seed)


Generator = Callable[..., list[Prompt]]
BUILTIN: dict[str, Generator] = {"ioi": ioi, "induction": induction}


def builtin_prompts(
    name: str, tokenizer: Any, n: int, seed: int = 0, part: str = "discovery"
) -> list[Prompt]:
    """``n`` prompts of the built-in task ``name`` (:data:`BUILTIN`).

    Example:
        >>> prompts = builtin_prompts("ioi", tokenizer, 8)  # doctest: +SKIP
        >>> task = encode_task(tokenizer, prompts, name="ioi")  # doctest: +SKIP
    """
    if name not in BUILTIN:
        raise InputError(f"unknown task {name!r}: choose one of {', '.join(BUILTIN)}")
    return BUILTIN[name](tokenizer, n, seed=seed, part=part)
