"""Gold data readers: the real files parse, malformed input is an error naming file and line."""

from __future__ import annotations

from pathlib import Path

import pytest

from headlab.datasets import read_conllu, read_frequencies, read_gap, read_stsb, sample_path
from headlab.errors import DataFormatError, InputError

GOOD = """# sent_id = s1
# text = The cat sat.
1\tThe\tthe\tDET\tDT\t_\t2\tdet\t_\t_
2\tcat\tcat\tNOUN\tNN\t_\t3\tnsubj\t_\t_
3-4\tsat.\t_\t_\t_\t_\t_\t_\t_\t_
3\tsat\tsit\tVERB\tVBD\t_\t0\troot\t_\t_
4\t.\t.\tPUNCT\t.\t_\t3\tpunct\t_\t_
4.1\tghost\t_\t_\t_\t_\t_\t_\t_\t_

"""


def test_conllu_words_heads_relations(tmp_path: Path) -> None:
    path = tmp_path / "t.conllu"
    path.write_text(GOOD)
    (s,) = read_conllu(path)
    assert s.sent_id == "s1"
    assert s.words == ("The", "cat", "sat", ".")  # multiword range and empty node skipped
    assert s.heads == (1, 2, -1, 2)
    assert s.relations == ("det", "nsubj", "root", "punct")


@pytest.mark.parametrize(
    ("bad_line", "message"),
    [
        ("2\tcat\tcat\tNOUN\tNN\t_\tx\tnsubj\t_\t_", "field 'head'"),
        ("2\tcat\tcat\tNOUN", "expected 10 tab-separated"),
        ("2\tcat\tcat\tNOUN\tNN\t_\t9\tnsubj\t_\t_", "points outside the sentence"),
        ("7\tcat\tcat\tNOUN\tNN\t_\t3\tnsubj\t_\t_", "expected word id 2"),
    ],
)
def test_malformed_conllu_names_file_and_line(tmp_path: Path, bad_line: str, message: str) -> None:
    lines = GOOD.splitlines()
    lines[3] = bad_line  # the "cat" line is line 4 of the file
    path = tmp_path / "bad.conllu"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataFormatError, match=message) as err:
        read_conllu(path)
    assert f"{path}:4:" in str(err.value)


def test_missing_files_are_input_errors(tmp_path: Path) -> None:
    for reader in (read_conllu, read_gap, read_stsb):
        with pytest.raises(InputError, match="cannot read"):
            reader(tmp_path / "nope")


def test_real_ud_ewt_dev(shared_data: Path) -> None:
    dev = read_conllu(shared_data / "ud-ewt" / "en_ewt-ud-dev.conllu")
    assert len(dev) == 2001  # SOURCE.md: 2,001 sentences, 25,147 syntactic words
    assert sum(len(s.words) for s in dev) == 25147
    assert all(s.heads.count(-1) == 1 for s in dev)


def test_real_gap_development(shared_data: Path) -> None:
    gap = read_gap(shared_data / "gap" / "gap-development.tsv")
    # SOURCE.md: 874 A, 925 B, 201 neither; every offset matches
    assert len(gap.examples) == 874 + 925
    assert gap.skipped == {
        "offsets do not match the text": 0,
        "no single referent": 201,
        "pronoun span is a candidate's": 0,
    }
    ex = gap.examples[0]
    assert ex.text[ex.pronoun[0] : ex.pronoun[1]].lower() in {
        "he",
        "him",
        "his",
        "she",
        "her",
        "hers",
    }


def test_gap_rows_with_bad_offsets_are_skipped_and_counted(tmp_path: Path) -> None:
    rows = (sample_path("gap").read_text().splitlines())[:4]
    cols = rows[1].split("\t")
    cols[3] = str(int(cols[3]) + 1)  # the pronoun offset no longer matches
    rows[1] = "\t".join(cols)
    path = tmp_path / "gap.tsv"
    path.write_text("\n".join(rows) + "\n")
    gap = read_gap(path)
    assert gap.skipped["offsets do not match the text"] == 1
    assert len(gap.examples) + sum(gap.skipped.values()) == 3


def test_stsb_reads_tabs_without_quoting(shared_data: Path) -> None:
    dev = read_stsb(shared_data / "stsb" / "sts-dev.csv")
    assert len(dev) == 1500
    assert any('"' in p.first or '"' in p.second for p in dev)  # quotes kept verbatim
    assert all(0 <= p.score <= 5 for p in dev)


def test_bundled_samples_and_their_licenses() -> None:
    folder = sample_path("treebank").parent
    assert len(read_conllu(sample_path("treebank"))) == 500
    assert len(read_gap(sample_path("gap")).examples) > 200
    stsb = read_stsb(sample_path("stsb"))
    assert {p.source for p in stsb} <= {"images", "track5.en-en", "answers-forums"}
    freq = read_frequencies(sample_path("frequencies"))
    assert freq["the"] > freq["cat"] > 0
    for name in ("ATTRIBUTION.md", "LICENSE-UD-EWT.txt", "LICENSE-GAP.txt", "LICENSE-STSB.txt"):
        assert (folder / name).is_file()
