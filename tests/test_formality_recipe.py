"""recipes/formality: the Tatoeba split by English sentence (split.py), and run.sh end to end on
a Tatoeba-like and a CoCoA-MT-like corpus of a few hundred lines with a tiny configuration."""

import importlib.util
import json
from pathlib import Path

import pytest

from helpers import RECIPES, TINY, read, run_recipe, shared, write

# (English, German): a Tatoeba-like corpus, several German translations of one English sentence
ADDRESSED = [
    ("Do you have time?", "Hast du Zeit?"), ("Do you have time?", "Haben Sie Zeit?"),
    ("Do you have time?", "Habt ihr Zeit?"), ("Thank you.", "Danke dir."), ("Thank you.", "Ich danke Ihnen."),
    ("Where are you?", "Wo bist du?"), ("Where are you?", "Wo sind Sie?"), ("It is raining.", "Es regnet."),
    ("Come here!", "Komm her!"), ("Come here!", "Kommen Sie her!"), ("She is tired.", "Sie ist müde."),
]
# (English, formal annotated, informal annotated): CoCoA-MT-like
SEGMENTS = [
    ("Do you like jazz?", "[F]Mögen Sie[/F] Jazz ?", "[F]Magst du[/F] Jazz ?"),
    ("What is your name?", "Wie ist [F]Ihr[/F] Name ?", "Wie ist [F]dein[/F] Name ?"),
    ("It is raining.", "Es regnet.", "Es regnet."),
]


def load_split():
    spec = importlib.util.spec_from_file_location("formality_split", RECIPES / "formality" / "split.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def corpora(root: Path, copies: int = 1) -> tuple[Path, Path]:
    """A Tatoeba-like directory (ADDRESSED, then Multi30k's first 300 pairs) and a CoCoA-MT-like one
    (SEGMENTS ``copies`` times in each domain)."""
    m30k = shared("multi30k")
    pairs = ADDRESSED + list(zip(read(m30k / "train.en")[:300], read(m30k / "train.de")[:300]))
    write(root / "tatoeba" / "tatoeba.en-de.en", [e for e, _ in pairs])
    write(root / "tatoeba" / "tatoeba.en-de.de", [d for _, d in pairs])
    strip = lambda s: s.replace("[F]", "").replace("[/F]", "")  # noqa: E731
    for domain in ("telephony", "topical_chat"):
        stem = root / "cocoa" / f"formality-control.train.{domain}.en-de"
        rows = SEGMENTS * copies
        for name, column in (("en", lambda r: r[0]), ("formal.annotated.de", lambda r: r[1]),
                             ("informal.annotated.de", lambda r: r[2]), ("formal.de", lambda r: strip(r[1])),
                             ("informal.de", lambda r: strip(r[2]))):
            write(Path(f"{stem}.{name}"), [column(r) for r in rows])
    return root / "tatoeba", root / "cocoa"


def test_the_split_keeps_an_english_sentence_on_one_side_and_is_deterministic(tmp_path):
    split = load_split()
    tatoeba, cocoa = corpora(tmp_path)
    counts = split.split(tatoeba, cocoa, tmp_path / "out", valid_percent=30)
    out = tmp_path / "out"
    train, valid = set(read(out / "train.en")), set(read(out / "valid.en"))
    assert train and valid and not train & valid
    assert counts["train"] + counts["valid"] == len(read(tatoeba / "tatoeba.en-de.en"))
    assert all(split.bucket(e) < 30 for e in valid) and all(split.bucket(e) >= 30 for e in train)
    # every translation of "Do you have time?" goes where the sentence goes
    side = "valid" if split.bucket("Do you have time?") < 30 else "train"
    pairs = list(zip(read(out / f"{side}.en"), read(out / f"{side}.de")))
    assert [d for e, d in pairs if e == "Do you have time?"] == ["Hast du Zeit?", "Haben Sie Zeit?", "Habt ihr Zeit?"]
    assert split.bucket("Do you have time?") == split.bucket("  Do you have time? ")  # the line's ends stripped
    # the test set: both domains in order, the references plain and annotated
    assert read(out / "test.en") == [s[0] for s in SEGMENTS] * 2
    assert read(out / "test.formal.de")[0] == "Mögen Sie Jazz ?"
    assert read(out / "test.informal.annotated.de")[1] == "Wie ist [F]dein[/F] Name ?"
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    split.split(tatoeba, cocoa, out, valid_percent=30)  # again, over its own output: the same bytes
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert json.loads((out / "split.json").read_text()) == counts


def test_the_oracle_input_asks_for_the_address_each_reference_has():
    spec = importlib.util.spec_from_file_location("formality_oracle", RECIPES / "formality" / "oracle.py")
    oracle = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(oracle)
    lines = oracle.oracle(["Do you have time?", "Do you have time?", "It is raining."],
                          ["Haben Sie Zeit?", "Hast du Zeit?", "Es regnet."])
    assert [json.loads(line) for line in lines] == [
        {"source": "Do you have time?", "formality": "formal"}, {"source": "Do you have time?", "formality": "informal"},
        {"source": "It is raining."}]
    with pytest.raises(ValueError):
        oracle.oracle(["a", "b"], ["x"])  # the two sides must have as many lines


@pytest.mark.slow
def test_the_recipe_trains_both_models_and_tabulates_every_request(tmp_path):
    tatoeba, cocoa = corpora(tmp_path, copies=3)
    config = write(tmp_path / "tiny.yaml", TINY.replace("bpe_vocab_size: 300", "bpe_vocab_size: 300\n  max_len_ratio: 9")
                   .splitlines())
    env = {"TATOEBA_DIR": tatoeba, "COCOA_DIR": cocoa, "WORK_DIR": tmp_path / "work", "CONFIG": config}
    first = run_recipe("formality/run.sh", env)
    work = tmp_path / "work"
    from xformer_cli.model.checkpoint import load_checkpoint

    assert load_checkpoint(work / "tagged" / "averaged.pt")["meta"]["formality"] == "de"
    assert "formality" not in load_checkpoint(work / "plain" / "averaged.pt")["meta"]
    assert (work / "plain" / "data-bin" / "spm.model").read_bytes() == (work / "tagged" / "data-bin" / "spm.model").read_bytes()
    assert sorted(p.name for p in (work / "tagged").glob("test.*")) == ["test.formal.de", "test.informal.de", "test.none.de"]
    assert sorted(p.name for p in (work / "plain").glob("test.*")) == ["test.none.de"]
    assert all(len(read(p)) == 18 for p in work.glob("*/test.*.de"))
    table = (work / "results.md").read_text()
    assert table.strip() in first.stdout and "6 updates" in table and "tagged training pairs:" in table
    first_table = table.split("\n\n")[1]
    rows = [line.split("|")[1:4] for line in first_table.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert [[c.strip() for c in row] for row in rows] == [
        ["plain", "none", "formal"], ["plain", "none", "informal"], ["tagged", "formal", "formal"],
        ["tagged", "informal", "informal"], ["tagged", "none", "formal"], ["tagged", "none", "informal"]]
    assert "| telephony | 9 |" in table and "| topical_chat | 9 |" in table  # accuracy by domain
    assert "between its two references:" in table  # the words that formality changes
    valid = [line for line in table.split("Tatoeba validation split")[1].splitlines() if line.startswith("| ")][1:]
    assert [line.split("|")[1:3] for line in valid] == [
        [" plain ", " untagged "], [" tagged ", " untagged "], [" tagged ", " each line its reference's formality "]]
    oracle = [json.loads(line) for line in read(work / "raw" / "valid.oracle.jsonl")]
    assert [r["source"] for r in oracle] == read(work / "raw" / "valid.en")
    again = run_recipe("formality/run.sh", env)
    # split, preprocess x2, train+average x2, 4 test outputs, the oracle input, 3 validation outputs
    assert again.stderr.count("skipped") == 1 + 2 + 2 * 2 + 4 + 1 + 3


def test_the_recipe_names_missing_data_before_any_work(tmp_path):
    result = run_recipe("formality/run.sh", {"TATOEBA_DIR": tmp_path / "none", "WORK_DIR": tmp_path / "work"},
                        check=False)
    assert result.returncode != 0 and "no Tatoeba EN-DE in" in result.stderr
    assert not (tmp_path / "work").exists()
