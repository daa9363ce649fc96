"""Each probe's vectorised sums against plain loops over tokens and words (NumPy oracle)."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest
import torch
from tests.models.tiny import tokenizer_path

from headlab.models import align
from headlab.roles import geometry
from headlab.roles.bootstrap import Sums
from headlab.roles.geometry import WordArgmaxStream, build_geometry, is_punctuation
from headlab.roles.probes import (
    broad,
    coreference,
    delimiter,
    induction,
    positional,
    rare,
    syntactic,
)

SENTENCES = [
    ["The", "chef", "who", "trained", "in", "Paris", "prepared", "the", "fish", "carefully", "."],
    ["Unbelievably", ",", "it", "works", "!"],
    ["A", "quick", "brown", "fox", "jumps", "over", "the", "lazy", "dog", "."],
]
# gold trees (0-based head, -1 root) for the sentences above, with relations
TREES = [
    (
        [1, 6, 3, 1, 5, 3, -1, 8, 6, 6, 6],
        ["det", "nsubj", "nsubj", "acl", "case", "obl", "root", "det", "obj", "advmod", "punct"],
    ),
    ([3, 0, 3, -1, 3], ["advmod", "punct", "nsubj", "root", "punct"]),
    (
        [3, 3, 3, 4, -1, 8, 8, 8, 4, 4],
        ["det", "amod", "amod", "nsubj", "root", "case", "det", "amod", "obl", "punct"],
    ),
]


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tokenizer_path()), local_files_only=True)


@pytest.fixture(scope="module")
def batch(tokenizer):
    alignments = [align(tokenizer, words=w) for w in SENTENCES]
    t = max(a.n_tokens for a in alignments)
    gen = torch.Generator().manual_seed(1)
    n_heads = 5
    pattern = torch.zeros(len(SENTENCES), n_heads, t, t)
    for b, a in enumerate(alignments):
        n = a.n_tokens
        logits = torch.randn(n_heads, n, n, generator=gen) * 3
        pattern[b, :, :n, :n] = torch.softmax(logits, -1)
    # make head 0 a perfect previous-token head on real rows
    for b, a in enumerate(alignments):
        for i in range(1, a.n_tokens):
            pattern[b, 0, i, :] = 0
            pattern[b, 0, i, i - 1] = 1
    geo = build_geometry(alignments, t, tokenizer, causal=False)
    return alignments, pattern, geo


RARE = "antidisestablishmentarianism photosynthesis Kilimanjaro thermodynamics Czechoslovakia"
RARE += " hydroelectricity bioluminescence Mississippi ornithologists paleontologists"


@pytest.fixture(scope="module")
def long_batch(tokenizer):
    """Two longer sentences where every other word is split into several tokens."""
    rare = RARE.split()
    common = [
        "the",
        "river",
        "and",
        "its",
        "old",
        "bridge",
        "near",
        "a",
        "quiet",
        "town",
        "with",
        "many",
    ]
    sentences = [
        [w for pair in zip(common, rare, strict=False) for w in pair] * 2,
        [w for pair in zip(rare[::-1], common, strict=False) for w in pair] + ["."],
    ]
    alignments = [align(tokenizer, words=w) for w in sentences]
    t = max(a.n_tokens for a in alignments)
    gen = torch.Generator().manual_seed(4)
    pattern = torch.zeros(len(sentences), 3, t, t)
    for b, a in enumerate(alignments):
        n = a.n_tokens
        pattern[b, :, :n, :n] = torch.softmax(torch.randn(3, n, n, generator=gen) * 3, -1)
    return alignments, pattern, build_geometry(alignments, t, tokenizer, causal=False)


@pytest.fixture(scope="module")
def tied_batch(long_batch):
    """The long sentences with weights rounded to quarters: many exact ties between words of
    one token and words of several (the first word must win) and rows of zeros."""
    alignments, pattern, geo = long_batch
    return alignments, (pattern * 4).round() / 4, geo


def _word_pattern(p: np.ndarray, a) -> np.ndarray:
    """Loop version: from-word mean over its tokens, to-word sum over its tokens."""
    n_words = len(a.words)
    out = np.zeros((n_words, n_words))
    for i in range(n_words):
        rows = [t for t in range(a.n_tokens) if a.token_to_word[t] == i]
        for j in range(n_words):
            cols = [s for s in range(a.n_tokens) if a.token_to_word[s] == j]
            out[i, j] = np.mean([sum(p[t, s] for s in cols) for t in rows])
    return out


def _argmax_excluding(row: np.ndarray, a, self_index: int) -> int:
    best, where = -1.0, -1
    for j, v in enumerate(row):
        if a.is_special[j] or j == self_index:
            continue
        if v > best:
            best, where = v, j
    return where


def _assert_word_argmax_matches_loops(got: torch.Tensor, alignments, pattern) -> None:
    """``got`` ``(B, H, W)``: each word's most attended word, as loops over the whole pattern."""
    for b, a in enumerate(alignments):
        for h in range(pattern.shape[1]):
            wp = _word_pattern(pattern[b, h].double().numpy(), a)
            for w in range(len(a.words)):
                assert int(got[b, h, w]) == _argmax_excluding(wp[w], a, w), (b, h, w)


def test_positional_delimiter_broad_match_loops(batch, tokenizer, kernels: str) -> None:
    """With the native row kernels (positional counts in C) and with torch's ops alone."""
    alignments, pattern, geo = batch
    pos = positional.collect(pattern, geo)
    dl = delimiter.collect(pattern, geo)
    br = broad.collect(pattern, geo)
    for b, a in enumerate(alignments):
        for h in range(pattern.shape[1]):
            p = pattern[b, h].double().numpy()
            hits = Counter()
            prev = nxt = cls = sep = punct = ent = 0.0
            for t in range(a.n_tokens):
                if a.is_special[a.token_to_word[t]]:
                    continue
                hits[int(np.argmax(p[t])) - t] += 1
                prev += p[t, t - 1] if t > 0 else 0.0
                nxt += p[t, t + 1] if t + 1 < p.shape[1] else 0.0
                for s in range(a.n_tokens):
                    w = a.token_to_word[s]
                    if a.is_special[w]:
                        if a.words[w] == tokenizer.cls_token:
                            cls += p[t, s]
                        else:
                            sep += p[t, s]
                    elif is_punctuation(a.words[w]):
                        punct += p[t, s]
                ent -= sum(x * math.log(x) for x in p[t] if x > 0)
            got = pos["positional.hits"][b, h].tolist()
            assert got == [hits[k] for k in positional.OFFSETS]
            assert pos["previous"][b, h] == pytest.approx(prev, abs=1e-5)
            assert pos["next"][b, h] == pytest.approx(nxt, abs=1e-5)
            assert dl["delimiter.cls"][b, h] == pytest.approx(cls, abs=1e-5)
            assert dl["delimiter.sep"][b, h] == pytest.approx(sep, abs=1e-5)
            assert dl["delimiter.punct"][b, h] == pytest.approx(punct, abs=1e-5)
            assert br["broad.entropy"][b, h] == pytest.approx(ent, abs=1e-4)
    # the planted previous-token head: every real query's argmax is at offset -1
    queries = geo.query.sum(1)
    assert torch.equal(pos["positional.hits"][:, 0, positional.OFFSETS.index(-1)], queries.float())


def test_positional_blocks_and_ties_native_equals_torch(batch, select_kernels) -> None:
    """The C pass counts the same argmax offsets as torch's ops, block by block (a causal block
    sees fewer keys than the sentence has tokens), with exact ties: uniform rows, where the
    leftmost offset in reach wins, and rows whose largest weight sits at two offsets."""
    select_kernels("native")
    _, pattern, geo = batch
    pattern = pattern.clone()
    n_tok = pattern.shape[-1]
    pattern[:, 1] = 1.0 / n_tok  # uniform rows
    for t in range(2, n_tok - 1):  # head 2: equal largest weights on t - 2 and t + 1
        pattern[:, 2, t] = 0.1 / n_tok
        pattern[:, 2, t, t - 2] = pattern[:, 2, t, t + 1] = 0.4
    for start, stop, seen in ((0, 5, n_tok), (5, 9, 11), (9, n_tok, n_tok)):
        rows = pattern[:, :, start:stop, :seen].contiguous()
        top = rows.amax(-1)
        fast = positional.collect(rows, geo, start, top=top)
        slow = positional.collect(rows, geo, start, top=top, native=False)
        assert torch.equal(fast["positional.hits"], slow["positional.hits"]), (start, stop)
        for key in ("previous", "next"):
            assert torch.allclose(fast[key], slow[key], atol=1e-6), (key, start)
    uniform = positional.collect(pattern, geo)["positional.hits"][:, 1]
    first = positional.OFFSETS.index(-3)
    # every counted row from the fourth token on finds its tie at offset -3 first
    assert torch.equal(uniform[:, first], geo.query[:, 3:].sum(1).float())


def test_word_argmax_syntactic_and_rare_match_loops(batch) -> None:
    alignments, pattern, geo = batch
    relations = sorted({r for _, rels in TREES for r in rels} - {"root"})
    rel_id = {r: i for i, r in enumerate(relations)}
    n_batch, n_words = geo.word_real.shape
    gold = torch.full((n_batch, n_words), -1)
    rel = torch.full((n_batch, n_words), len(relations))
    for b, ((heads, rels), a) in enumerate(zip(TREES, alignments, strict=True)):
        plain = a.plain_words
        for k, (h, r) in enumerate(zip(heads, rels, strict=True)):
            if h >= 0:
                gold[b, plain[k]], rel[b, plain[k]] = plain[h], rel_id[r]
    wp = geo.word_patterns(pattern)
    argmax = geo.word_argmax(wp)
    hits = syntactic.collect(argmax, gold, rel, len(relations))
    freq = Counter({"the": 100, "a": 90, "chef": 5, "fish": 5, "paris": 2, "fox": 3, "dog": 3})
    for b, ((heads, rels), a) in enumerate(zip(TREES, alignments, strict=True)):
        plain = a.plain_words
        target = rare.targets(SENTENCES[b], freq)
        for h in range(pattern.shape[1]):
            ref = _word_pattern(pattern[b, h].double().numpy(), a)
            np.testing.assert_allclose(wp[b, h, : len(a.words), : len(a.words)], ref, atol=1e-5)
            arg = {k: _argmax_excluding(ref[plain[k]], a, plain[k]) for k in range(len(plain))}
            dep, head = Counter(), Counter()
            for k, (g, r) in enumerate(zip(heads, rels, strict=True)):
                if g >= 0 and arg[k] == plain[g]:
                    dep[r] += 1
            for k in range(len(plain)):  # word k attends to j: right if j's head is k
                j = a.plain_words.index(arg[k])
                if heads[j] == k:
                    head[rels[j]] += 1
            for r, i in rel_id.items():
                assert hits[b, h, i, 0] == dep[r], (b, h, r)
                assert hits[b, h, i, 1] == head[r], (b, h, r)
            rare_hits = sum(
                1
                for k in range(len(plain))
                if not target[k] and target[a.plain_words.index(arg[k])]
            )
            rmask = torch.zeros(1, n_words, dtype=torch.bool)
            qmask = torch.zeros(1, n_words, dtype=torch.bool)
            for k, t in enumerate(target):
                rmask[0, plain[k]], qmask[0, plain[k]] = t, not t
            got = rare.collect(argmax[b : b + 1, h : h + 1], rmask, qmask)
            assert int(got) == rare_hits


@pytest.mark.parametrize("data", ["batch", "long_batch"])
def test_word_argmax_from_word_sums_matches_loops(
    request: pytest.FixtureRequest, data: str
) -> None:
    """Short inputs take the word argmax straight from unnormalised word sums (special words,
    padding words and the word itself excluded): the same words as loops."""
    alignments, pattern, geo = request.getfixturevalue(data)
    got = geo.word_argmax_sums(geo.word_sums(pattern))
    _assert_word_argmax_matches_loops(got, alignments, pattern)


def test_first_argmax_is_the_first_maximum() -> None:
    """The chunked argmax gives torch's max: the same values and, among ties, the first index."""
    g = torch.Generator().manual_seed(3)
    x = torch.randint(0, 4, (5, 7, 3 * geometry.ARGMAX_CHUNK), generator=g).float() - 1.0
    x[0, 0] = -1.0  # a row of one value: index 0
    best, where = geometry.first_argmax(x)
    expected = x.max(-1)
    assert torch.equal(best, expected.values)
    assert torch.equal(where, expected.indices)
    assert where[0, 0] == 0


@pytest.mark.parametrize("data", ["batch", "long_batch", "tied_batch"])
@pytest.mark.parametrize("way", ["torch", "torch-chunked", "native", "portable"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("rows", [1, 2, 5, 7, 64])
def test_word_argmax_from_blocks_of_rows_matches_loops(
    request: pytest.FixtureRequest,
    data: str,
    causal: bool,
    rows: int,
    way: str,
    monkeypatch: pytest.MonkeyPatch,
    select_kernels,
) -> None:
    """Long inputs get word argmaxes block by block (words cut by a block boundary, causal
    blocks that see only earlier keys): the same words as loops over the whole pattern, from
    torch's steps (also when long rows take the chunked argmax) and from the native kernel
    (with and without its AVX-512 paths)."""
    use_native = way in ("native", "portable")
    if use_native:
        select_kernels(way)
    if way == "torch-chunked":
        monkeypatch.setattr(geometry, "CHUNKED_FROM", 1)
    alignments, pattern, geo = request.getfixturevalue(data)
    if causal:  # renormalised lower triangle: what a causal head's blocks look like
        n_tok = pattern.shape[-1]
        pattern = pattern * torch.ones(n_tok, n_tok).tril()
        pattern = pattern / pattern.sum(-1, keepdim=True).clamp_min(1e-9)
    assert any(len(set(a.token_to_word)) < a.n_tokens for a in alignments)  # multi-token words
    stream = WordArgmaxStream(geo, pattern.shape[1], native=use_native)
    assert stream.native == use_native
    n_tok = pattern.shape[2]
    for start in range(0, n_tok, rows):
        stop = min(n_tok, start + rows)
        seen = stop if causal else n_tok  # a causal block is handed only the keys it sees
        stream.add(pattern[:, :, start:stop, :seen], start)
    got = stream.result()
    _assert_word_argmax_matches_loops(got, alignments, pattern)


@pytest.mark.parametrize("way", ["torch", "native", "portable"])
def test_word_argmax_ties_between_split_words_go_to_the_first(
    tokenizer, way: str, select_kernels
) -> None:
    """Each row puts the same total weight on two words of several tokens that lie 16 split
    words apart (the native kernel sums such words 16 at a time): the earlier word wins, as
    with argmax, and a row's own word never does."""
    if way != "torch":
        select_kernels(way)
    words = [w for rare in RARE.split() for w in ("the", rare)] * 3
    a = align(tokenizer, words=words)
    split = [w for w in range(len(a.words)) if a.token_to_word.count(w) > 1]
    assert len(split) > 17
    pattern = torch.zeros(1, 2, a.n_tokens, a.n_tokens)
    for t in range(a.n_tokens):
        for h, (x, y) in enumerate([(split[0], split[16]), (split[1], split[17])]):
            for w in (x, y):
                tokens = [s for s in range(a.n_tokens) if a.token_to_word[s] == w]
                for s in tokens:
                    pattern[0, h, t, s] = 0.25 / len(tokens)
    one = build_geometry([a], a.n_tokens, tokenizer, causal=False)
    stream = WordArgmaxStream(one, 2, native=way != "torch")
    assert stream.native == (way != "torch")
    for start in range(0, a.n_tokens, 5):
        stream.add(pattern[:, :, start : start + 5], start)
    got = stream.result()
    _assert_word_argmax_matches_loops(got, [a], pattern)
    assert int(got[0, 0, split[5]]) == split[0]
    assert int(got[0, 0, split[0]]) == split[16]  # its own word is excluded


def test_fixed_offset_baseline_by_hand() -> None:
    # the cat sat on the mat: det(cat->the) nsubj(sat->cat) case(mat->on) det(mat->the) obl(sat->mat)
    heads = [1, 2, -1, 5, 5, 2]
    rels = ["det", "nsubj", "root", "case", "det", "obl"]
    ids = {"det": 0, "nsubj": 1, "case": 2, "obl": 3}
    counts, base = syntactic.sentence_counts(heads, [ids.get(r, -1) for r in rels], 4)
    at = syntactic.OFFSETS.index
    assert counts[0].tolist() == [2, 2]  # two det arcs; two (head, det) pairs
    assert base[0, 0, at(1)] == 2  # both determiners sit just before their noun
    assert base[0, 1, at(-1)] == 2  # and each noun finds its determiner at -1
    assert base[3, 0, at(-3)] == 1  # mat -> sat is 3 words back
    assert base[2, 1, at(-2)] == 1  # mat finds "on" two words back


def _sentence_counts_loops(heads, rels, n_rel):
    """The baseline counted arc by arc (the definition, written out)."""
    counts = np.zeros((n_rel, 2))
    base = np.zeros((n_rel, 2, len(syntactic.OFFSETS)))
    pairs = set()
    for d, (h, r) in enumerate(zip(heads, rels, strict=True)):
        if h < 0 or r < 0:
            continue
        counts[r, 0] += 1
        pairs.add((h, r))
        if h - d in syntactic.OFFSETS:
            base[r, 0, syntactic.OFFSETS.index(h - d)] += 1
        if d - h in syntactic.OFFSETS:  # the head finds this dependent d - h words away
            base[r, 1, syntactic.OFFSETS.index(d - h)] += 1
    for _, r in pairs:
        counts[r, 1] += 1
    return counts, base


def test_fixed_offset_baseline_matches_loops_on_random_trees() -> None:
    """Counts and baselines of random trees (long arcs beyond the offsets, uncounted relations,
    several dependents of one relation on one head) as counted arc by arc."""
    rng = np.random.default_rng(3)
    for n in (1, 2, 7, 40, 90):
        heads = [-1 if i == 0 else int((i + rng.integers(1, n)) % n) for i in range(n)]
        rels = [int(r) for r in rng.integers(-1, 5, size=n)]
        counts, base = syntactic.sentence_counts(heads, rels, 5)
        want_counts, want_base = _sentence_counts_loops(heads, rels, 5)
        assert np.array_equal(counts.numpy(), want_counts), n
        assert np.array_equal(base.numpy(), want_base), n


def test_coreference_counts_the_right_name(batch) -> None:
    alignments, pattern, geo = batch
    # in sentence 0: "who" (word 3 after [CLS]) as the pronoun; candidates "chef" and "Paris"
    a = alignments[0]
    plain = a.plain_words
    pronoun = torch.tensor([plain[2]])
    cands = torch.zeros(1, 2, geo.word_real.shape[1], dtype=torch.bool)
    cands[0, 0, plain[1]] = True
    cands[0, 1, plain[5]] = True
    small = geo.__class__(**{k: v[:1] for k, v in vars(geo).items()})
    row = coreference.pronoun_row(pattern[:1], small, pronoun)
    got = coreference.collect(row, cands, torch.tensor([0]))
    for h in range(pattern.shape[1]):
        ref = _word_pattern(pattern[0, h].double().numpy(), a)
        want = ref[plain[2], plain[1]] > ref[plain[2], plain[5]]
        assert bool(got[0, h]) == want


def test_induction_score_reads_the_token_after_the_earlier_copy() -> None:
    half, start = 4, 1
    t = start + 2 * half
    pattern = torch.zeros(1, 4, t, t)
    pattern[0, 0] = torch.eye(t)  # head 0 attends to itself
    for i in range(half - 1):  # head 1 is a perfect induction head
        pattern[0, 1, start + half + i, start + i + 1] = 1.0
    for i in range(1, t):  # head 2 attends to the previous token everywhere
        pattern[0, 2, i, i - 1] = 1.0
    for i in range(half):  # head 3: to the earlier occurrence of the same token
        pattern[0, 3, start + half + i, start + i] = 1.0
    score = induction.collect(pattern, half, start)
    assert score["induction"][0].tolist() == [0.0, 1.0, 0.0, 0.0]
    assert score["previous_token"][0].tolist() == [0.0, 0.0, 1.0, 0.0]
    assert score["duplicate_token"][0].tolist() == [0.0, 0.0, 0.0, 1.0]


def test_poisson_bootstrap_replicate_zero_is_the_plain_sum() -> None:
    sums = Sums(n_items=6, replicates=50, seed=3)
    values = torch.arange(12.0).view(6, 2)
    sums.add("x", [4, 0, 2], values[[4, 0, 2]])
    sums.add("x", [1, 3, 5], values[[1, 3, 5]])
    total = sums.get("x")
    assert torch.equal(total[0], values.sum(0).double())
    # replicates differ from each other and average out near the plain sum
    assert total[1:].std(0).min() > 0
    assert abs(float(total[1:, 0].mean()) - 30.0) < 8
    again = Sums(n_items=6, replicates=50, seed=3)
    assert torch.equal(again.weights, sums.weights)


def _sink_loops(p: np.ndarray, a, cls_token: str | None) -> dict[str, float]:
    """The sink and delimiter sums of one head, as loops: rows after the first position that
    are real words; the sink's parts ([CLS], other specials, a first position that is a word)
    and punctuation after the first position."""
    out = dict.fromkeys(delimiter.PARTS, 0.0)
    for t in range(1, a.n_tokens):
        if a.is_special[a.token_to_word[t]]:
            continue
        for s in range(t + 1 if causal_rows(p) else a.n_tokens):
            w = a.token_to_word[s]
            if a.is_special[w]:
                out["cls" if a.words[w] == cls_token else "sep"] += p[t, s]
            elif s == 0:
                out["first"] += p[t, s]
            elif is_punctuation(a.words[w]):
                out["punct"] += p[t, s]
    return out


def causal_rows(p: np.ndarray) -> bool:
    return bool(np.allclose(np.triu(p, 1), 0.0))


@pytest.mark.parametrize("bos", [False, True])
def test_sink_and_delimiter_on_a_decoder_match_loops(tokenizer, bos: bool) -> None:
    """A decoder's batch: without a BOS its first word is the sink (its own row, which sees
    only itself, is left out) and a leading quote there is not punctuation; with a BOS (a
    special first token) the BOS is the sink. Sums against loops; the scores' sink is the
    three parts together and "delimiter" is punctuation alone."""
    sentences = [['"', "Yes", ",", "she", "said", '"', "."], ["It", "rains", "(", "again", ")"]]
    alignments = [align(tokenizer, words=w) for w in sentences]
    if not bos:  # the tiny tokenizer adds [CLS]/[SEP]: drop them, as a decoder's has none
        alignments = [_without_specials(a) for a in alignments]
    t = max(a.n_tokens for a in alignments)
    gen = torch.Generator().manual_seed(7)
    pattern = torch.zeros(len(alignments), 3, t, t)
    for b, a in enumerate(alignments):
        n = a.n_tokens
        logits = torch.randn(3, n, n, generator=gen) * 2
        logits = logits.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), -torch.inf)
        pattern[b, :, :n, :n] = torch.softmax(logits, -1)
    geo = build_geometry(alignments, t, tokenizer, causal=True)
    dl = delimiter.collect(pattern, geo)
    cls_token = tokenizer.cls_token
    for b, a in enumerate(alignments):
        for h in range(3):
            want = _sink_loops(pattern[b, h].double().numpy(), a, cls_token)
            for part in delimiter.PARTS:
                assert dl[f"delimiter.{part}"][b, h] == pytest.approx(want[part], abs=1e-5)
    if not bos:
        assert float(dl["delimiter.first"].sum()) > 0.0  # the first word takes the sink's part
    rows = delimiter.count(geo)
    items = list(range(len(alignments)))
    sums = Sums(len(items), 0, 0)
    sums.add("delimiter.queries", items, rows)
    for name, value in dl.items():
        sums.add(name, items, value[:, None, :])  # (B, L=1, H)
    sc = delimiter.scores(sums)
    total = sum(dl[f"delimiter.{p}"] for p in delimiter.SINK_PARTS).sum(0)  # (H,)
    n_rows = float(rows.sum())
    assert n_rows == sum(
        1 for a in alignments for t in range(1, a.n_tokens) if not a.is_special[a.token_to_word[t]]
    )
    for h in range(3):
        assert float(sc["sink"][0, 0, h]) == pytest.approx(float(total[h]) / n_rows, abs=1e-6)
        punct = float(dl["delimiter.punct"].sum(0)[h]) / n_rows
        assert float(sc["delimiter"][0, 0, h]) == pytest.approx(punct, abs=1e-6)


def _without_specials(a):
    """An alignment with its special words ([CLS], [SEP]) removed, as a decoder's without BOS."""
    from dataclasses import replace

    keep = [w for w in range(len(a.words)) if not a.is_special[w]]
    index = {w: i for i, w in enumerate(keep)}
    tokens = [index[w] for w in a.token_to_word if w in index]
    return replace(
        a,
        words=tuple(a.words[w] for w in keep),
        is_special=tuple(False for _ in keep),
        token_to_word=tuple(tokens),
        word_spans=tuple(a.word_spans[w] for w in keep),
    )
