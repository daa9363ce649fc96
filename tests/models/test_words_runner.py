"""Words from subword tokens, the corpus runner, and bad input on real loading paths."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tests.conftest import needs_smollm2
from tests.models.tiny import build

from headlab.errors import (
    AlignmentError,
    ConfigError,
    InputError,
    ModelLoadError,
    TooLongError,
    UnsupportedModelError,
)
from headlab.models import (
    HeadCapture,
    align,
    encode,
    load,
    run_corpus,
    word_attention,
    word_pattern,
)


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory: pytest.TempPathFactory):
    return load(build("bert", tmp_path_factory.mktemp("bert")))


@pytest.fixture(scope="module")
def tiny_gpt2(tmp_path_factory: pytest.TempPathFactory):
    return load(build("gpt2", tmp_path_factory.mktemp("gpt2")))


def test_alignment_of_raw_text_and_of_given_words(tiny_bert) -> None:
    a = align(tiny_bert.tokenizer, text="Unbelievably, the chef's fish was ok.")
    plain = [w for w, s in zip(a.words, a.is_special, strict=True) if not s]
    assert plain == ["Unbelievably", ",", "the", "chef's", "fish", "was", "ok", "."]
    assert a.words[0] == "[CLS]" and a.words[-1] == "[SEP]"
    assert a.n_tokens > len(a.words)  # "Unbelievably" is several word pieces
    b = align(tiny_bert.tokenizer, words=["Unbelievably", ",", "the", "chef"])
    assert [w for w, s in zip(b.words, b.is_special, strict=True) if not s] == [
        "Unbelievably",
        ",",
        "the",
        "chef",
    ]


def test_word_pattern_sums_to_words_and_averages_from_words(tiny_bert) -> None:
    a = align(tiny_bert.tokenizer, text="Unbelievably good")
    t = a.n_tokens
    pattern = torch.softmax(torch.randn(3, t, t), -1)
    words = word_pattern(pattern, a)
    assert words.shape == (3, len(a.words), len(a.words))
    torch.testing.assert_close(words.sum(-1), torch.ones(3, len(a.words)))
    # NumPy-loop oracle: to a word = sum over its tokens; from a word = mean over its tokens
    for i in range(len(a.words)):
        rows = [k for k in range(t) if a.token_to_word[k] == i]
        for j in range(len(a.words)):
            cols = [k for k in range(t) if a.token_to_word[k] == j]
            expected = pattern[0][rows][:, cols].sum(-1).mean()
            torch.testing.assert_close(words[0, i, j], expected)


def test_corpus_runner_batched_equals_unbatched(tiny_gpt2) -> None:
    sentences = [
        "one two three four five six",
        "a b",
        "The chef prepared the fish carefully today .",
        ["Given", "words", "work", "too"],
        "x",
    ]
    batched: dict[int, torch.Tensor] = {}
    sizes: list[int] = []

    def consume(batch) -> None:
        sizes.append(len(batch.indices))
        pat = batch.capture.pattern(1)
        for row, (i, n) in enumerate(zip(batch.indices, batch.lengths, strict=True)):
            batched[i] = pat[row, :, :n, :n].clone()

    skipped = run_corpus(tiny_gpt2, sentences, consume, batch_tokens=40)
    assert not skipped and sorted(batched) == list(range(5))
    assert len(sizes) > 1  # it really batched, in several batches
    for i, s in enumerate(sentences):
        text = s if isinstance(s, str) else " ".join(s)
        inputs = encode(tiny_gpt2, [text])
        with torch.no_grad(), HeadCapture(tiny_gpt2, layers=[1]) as cap:
            tiny_gpt2.model(**inputs)
        torch.testing.assert_close(batched[i], cap.pattern(1)[0], atol=1e-5, rtol=1e-5)


def test_runner_skips_and_counts_what_it_cannot_use(tiny_bert) -> None:
    too_long = "word " * 200  # the tiny model takes 128 positions
    skipped = run_corpus(tiny_bert, ["fine sentence", too_long, "also fine"], lambda b: None)
    assert [s.index for s in skipped] == [1]
    assert "at most 128" in skipped[0].reason
    assert skipped[0].kind == TooLongError.kind == "longer than the model accepts"


def test_alignment_failures_have_their_own_error_types(tiny_bert) -> None:
    """Callers tell a sentence too long from one that cannot be aligned by the error's type
    (and its ``kind``), never by its message; both stay InputErrors."""
    with pytest.raises(TooLongError, match="at most 4"):
        align(tiny_bert.tokenizer, text="one two three four five", max_tokens=4)
    # a word made of a control character: the tokenizer drops it, so it gets no token
    with pytest.raises(AlignmentError, match="no token for the words") as info:
        align(tiny_bert.tokenizer, words=["a", "\x07", "b"])
    assert isinstance(info.value, InputError)
    assert info.value.kind == "words could not be aligned to tokens"
    skipped = run_corpus(tiny_bert, [["a", "\x07", "b"], ["fine"]], lambda b: None)
    assert [(s.index, s.kind) for s in skipped] == [(0, AlignmentError.kind)]


def test_bad_text_input(tiny_bert) -> None:
    with pytest.raises(InputError, match="the text is empty"):
        word_attention(tiny_bert, "   ")
    with pytest.raises(InputError, match="at most 128"):
        word_attention(tiny_bert, "word " * 200)
    wa = word_attention(tiny_bert, "The chef cooked.")
    with pytest.raises(
        InputError, match=r"word 'fish' is not in the sentence \(words: The chef cooked \.\)"
    ):
        wa.top(0, 0, "fish")
    with pytest.raises(InputError, match=r"heads \[9\] out of range"):
        HeadCapture(tiny_bert, ablate={0: [9]})


def test_bad_model_folders(tmp_path: Path, tiny_bert) -> None:
    with pytest.raises(ModelLoadError, match="does not exist"):
        load(tmp_path / "missing")
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{oops")
    with pytest.raises(Exception, match=r"config.json: not valid JSON"):
        load(broken)
    pickled = tmp_path / "pickled"
    pickled.mkdir()
    (pickled / "config.json").write_text(json.dumps({"model_type": "bert"}))
    (pickled / "pytorch_model.bin").write_bytes(b"\x80\x04")
    with pytest.raises(ModelLoadError, match=r"only pickle checkpoints.*safetensors only"):
        load(pickled)
    no_heads = tmp_path / "no_heads"
    no_heads.mkdir()
    (no_heads / "config.json").write_text(
        json.dumps({"model_type": "bert", "num_hidden_layers": 2, "hidden_size": 8})
    )
    (no_heads / "model.safetensors").write_bytes(b"")
    with pytest.raises(ConfigError, match="no number of attention heads"):
        load(no_heads)
    alien = tmp_path / "alien"
    alien.mkdir()
    (alien / "config.json").write_text(
        json.dumps(
            {"model_type": "deberta-v2", "num_hidden_layers": 2, "num_attention_heads": 2}
            | {"hidden_size": 8, "vocab_size": 100}
        )
    )
    (alien / "model.safetensors").write_bytes(b"")
    tiny_bert.tokenizer.save_pretrained(alien)
    with pytest.raises(
        UnsupportedModelError,
        match=r"^attention in DebertaV2Model does not go through transformers' attention interface$",
    ):
        load(alien)
    corrupt = tmp_path / "corrupt"
    tiny_bert.model.config.save_pretrained(corrupt)
    tiny_bert.tokenizer.save_pretrained(corrupt)
    (corrupt / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(ModelLoadError, match="cannot load the weights"):
        load(corrupt)


def test_alignment_with_a_byte_level_bpe_tokenizer() -> None:
    """GPT-2-style tokenizers put the leading space inside tokens; words must still line up."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    bpe.train_from_iterator(
        ["The chef who trained in Paris prepared the fish carefully."] * 5, trainer
    )
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|endoftext|>")
    a = align(tokenizer, text="The chef's  unbelievably fresh fish, prepared.")
    assert list(a.words) == ["The", "chef's", "unbelievably", "fresh", "fish", ",", "prepared", "."]
    assert not any(a.is_special)
    assert a.n_tokens > len(a.words)  # unseen words fall apart into byte pieces
    assert a.token_to_word == tuple(sorted(a.token_to_word))  # tokens stay in word order


def test_word_index_takes_the_nth_occurrence(tiny_bert) -> None:
    """``the`` is the first "the" as written (not "The", #58), ``the#2`` the second; a word in
    another case only is found when one spelling fits; a missing occurrence or word is a
    one-line error naming what is there."""
    a = align(tiny_bert.tokenizer, text="The cat saw the dog near the tree.")
    plain = [i for i, s in enumerate(a.is_special) if not s]
    words = [a.words[i] for i in plain]
    assert words[:2] == ["The", "cat"]
    lower = [plain[i] for i, w in enumerate(words) if w == "the"]  # the oracle: exact matches
    assert len(lower) == 2
    assert a.word_index("the") == lower[0] != plain[0]
    assert a.word_index("the#2") == lower[1]
    assert a.word_index("The") == plain[0]
    assert a.word_index("CAT") == plain[1]  # one spelling in another case: no doubt
    with pytest.raises(InputError, match=r"only in another case, as 'The' and 'the'"):
        a.word_index("THE#3")
    with pytest.raises(
        InputError, match=r"'the' occurs 2 time\(s\) in the sentence \(as written; The not"
    ):
        a.word_index("the#3")
    with pytest.raises(InputError, match="count from 1"):
        a.word_index("the#0")
    with pytest.raises(InputError, match="'fish' is not in the sentence"):
        a.word_index("fish#2")


def test_captured_heads_out_of_range_are_a_clear_error(tiny_bert) -> None:
    batch = encode(tiny_bert, ["The cat sat."])
    n = tiny_bert.layout.heads_per_layer[1]
    with torch.no_grad(), HeadCapture(tiny_bert) as cap:
        tiny_bert.model(**batch)
    with pytest.raises(
        InputError, match=rf"heads \[{n}\] out of range: layer 1 has heads 0..{n - 1}"
    ):
        cap.pattern(1, heads=[0, n])
    with pytest.raises(InputError, match="out of range"):
        cap.contributions(1, heads=[-1])
    assert cap.pattern(1, heads=[n - 1]).shape[1] == 1


HOSTILE = [
    "Don't stop... ever.",
    'He said "stop."',
    "It costs $5.00!!",
    "(see above).",
    "Go to https://example.com/a?b=1 now.",
    "=(",
]


def _check_covers(a, text: str) -> None:  # type: ignore[no-untyped-def]
    """Every character of the text but spaces is in exactly one word, words in text order,
    each word's span reading as the word."""
    plain = [i for i, s in enumerate(a.is_special) if not s]
    assert "".join(a.words[i] for i in plain) == "".join(text.split())
    for i in plain:
        start, end = a.word_spans[i]
        assert text[start:end] == a.words[i]
    assert a.token_to_word == tuple(sorted(a.token_to_word))


def test_tokens_across_punctuation_merge_into_one_word() -> None:
    """A byte-level BPE token that spans several punctuation marks, or a mark and a word
    ('."', '...', '.com'), makes them one word; the text is never refused."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    bpe.train_from_iterator(HOSTILE * 20 + ['example.com!! wait... "yes." =('] * 20, trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe)
    merged = 0
    for text in HOSTILE:
        a = align(tokenizer, text=text)
        _check_covers(a, text)
        merged += sum(len(w) > 1 and not any(c.isalnum() for c in w) for w in a.words)
    assert merged >= 3  # "...", '."', "!!" and the like really were single tokens here


def test_minilm_splits_punctuation_as_before(tiny_bert) -> None:
    lm = tiny_bert
    for text in HOSTILE:
        a = align(lm.tokenizer, text=text)
        _check_covers(a, text)
        assert all(len(w) == 1 for w in a.words if not any(c.isalnum() for c in w))


@needs_smollm2
def test_smollm2_takes_ordinary_english(capsys: pytest.CaptureFixture[str]) -> None:
    from headlab.cli import main

    for text in HOSTILE:
        assert main(["heads", text, "--model", "smollm2", "--json"]) == 0, text
        out = json.loads(capsys.readouterr().out)
        assert out["heads"] and all(h["top"] for h in out["heads"])
    assert main(["heads", HOSTILE[0], "--model", "smollm2", "--word", "...", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["word"] == "..."


def test_a_text_whose_patterns_would_not_fit_is_refused_before_the_forward(
    tiny_bert, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """#58: every head's T x T pattern of a long text can take more memory than there is (30
    layers x 9 heads x 8,192^2 float32 is 72 GiB in SmolLM2); the text is refused in one line
    with the most tokens that fit, before the forward pass."""
    import headlab.models.analysis as analysis
    from headlab.cli import main

    text = "The cat sat on the mat and looked at the dog near the old tree."
    n = len(tiny_bert.tokenizer(text)["input_ids"])
    heads, widest = sum(tiny_bert.layout.heads_per_layer), max(tiny_bert.layout.heads_per_layer)
    need = (heads + 2 * widest) * n * n * 4  # the oracle: every pattern, one layer's two more

    def no_forward(*args: object, **kwargs: object) -> None:
        raise AssertionError("the forward pass ran")

    available = int(need / 0.8) - 64
    most = max(m for m in range(n + 1) if (heads + 2 * widest) * m * m * 4 <= 0.8 * available)
    with monkeypatch.context() as m:
        m.setattr(analysis, "available_bytes", lambda device: available)
        m.setattr(analysis, "HeadCapture", no_forward)
        with pytest.raises(TooLongError) as info:
            word_attention(tiny_bert, text)
    line = str(info.value)
    assert line.startswith(f"the text is {n} tokens long: every head's attention pattern")
    assert line.endswith(f"at most {most} tokens fit (shorten it)") and most == n - 1
    monkeypatch.setattr(analysis, "available_bytes", lambda device: int(need / 0.8) + 64)
    assert word_attention(tiny_bert, text).alignment.n_tokens == n  # it fits: it runs
    monkeypatch.setattr(analysis, "available_bytes", lambda device: 1 << 10)
    assert main(["heads", text, "--model", "tiny-shakespeare"]) == 1
    (err,) = capsys.readouterr().err.strip().splitlines()
    assert err.startswith("headlab: error: the text is ") and "of the 1.0 KiB available" in err
