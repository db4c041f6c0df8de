"""Task readers: RTE, sentence polarity and ARCT counts, labels and splits."""
import pytest
from conftest import require_data

from bertscope.data.readers.tasks import (
    read_arct,
    read_arct_file,
    read_polarity,
    read_rte,
    read_rte_file,
    read_task,
    stratified_split,
)
from bertscope.errors import UserError


def test_rte_counts_and_labels():
    require_data("rte")
    train, dev, test = read_rte("train"), read_rte("dev"), read_rte("test")
    assert (len(train), len(dev), len(test)) == (3030, 337, 800)
    assert len(read_rte("all")) == 4167
    assert sum(ex.label for ex in test) == 410
    assert not {ex.id for ex in train} & {ex.id for ex in dev}
    assert read_rte("dev", seed=1) != dev


def test_polarity_split_is_stratified_and_seeded():
    require_data("sentence_polarity")
    parts = [read_polarity(s) for s in ("train", "dev", "test")]
    assert [len(p) for p in parts] == [8530, 1066, 1066]
    assert [sum(ex.label for ex in p) for p in parts] == [4265, 533, 533]
    assert len({ex.id for p in parts for ex in p}) == 10662
    assert read_polarity("test") == read_polarity("test", seed=0)
    assert read_polarity("test", seed=1) != parts[2]


def test_arct_original_and_adversarial():
    require_data("arct")
    assert [len(read_arct(s)) for s in ("train", "dev", "test")] == [1210, 316, 444]
    assert [len(read_arct(s, "adversarial")) for s in ("train", "dev", "test")] == [2420, 632, 888]
    adv = read_arct("test", "adversarial")  # columns in another order in this file
    assert all(ex.label in (0, 1) and ex.claim and ex.warrant0 for ex in adv)


def test_hand_made_files(tmp_path):
    rte = tmp_path / "rte1_dev.xml"
    rte.write_text('<entailment-corpus challenge="1"><pair id="3" value="TRUE"><t> A  b </t><h>c</h></pair>'
                   '<pair id="4" entailment="NO"><t>d</t><h>e</h></pair></entailment-corpus>')
    assert [(ex.text_a, ex.text_b, ex.label) for ex in read_rte_file(rte)] == [("A b", "c", 1), ("d", "e", 0)]
    arct = tmp_path / "a.tsv"
    arct.write_text("#id\tclaim\treason\twarrant1\twarrant0\tcorrectLabelW0orW1\nx\tC\tR\tW1\tW0\t1\n")
    assert read_arct_file(arct)[0].warrants == ("W0", "W1") and read_arct_file(arct)[0].label == 1
    (tmp_path / "bad.tsv").write_text("#id\tclaim\nx\ty\n")
    with pytest.raises(UserError, match="expected the columns"):
        read_arct_file(tmp_path / "bad.tsv")


def test_stratified_split_parts():
    parts = stratified_split([0] * 10 + [1] * 20, (0.8, 0.1, 0.1), seed=0)
    assert [len(p) for p in parts] == [24, 3, 3]
    assert sorted(i for p in parts for i in p) == list(range(30))


def test_unknown_task_and_split():
    with pytest.raises(UserError, match="unknown task"):
        read_task("mnli", "train")
    with pytest.raises(UserError, match="unknown split"):
        read_rte("validation")
