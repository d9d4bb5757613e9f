"""Tatoeba EN-DE into training and validation pairs, by English sentence, and CoCoA-MT EN-DE's two
domains into one test set: the data of recipes/formality/run.sh.

    python split.py TATOEBA_DIR COCOA_DIR OUT_DIR [--valid-percent 2]

Tatoeba gives one English sentence several German translations (du, Sie, ihr: each a line). A pair
goes to validation when its English sentence (as written, whitespace stripped at the ends) hashes
into the first VALID_PERCENT of 100 buckets: the first 8 hex digits of its SHA-256 (UTF-8) as a
number, modulo 100. So every translation of one English sentence is on the same side, no English
sentence is on both, and the split is the same on every machine and for any order of the lines.

Writes OUT_DIR/train.{en,de}, valid.{en,de} (in the corpus's order), and test.en,
test.{formal,informal}.de (the references) and test.{formal,informal}.annotated.de (marked
[F]...[/F], for bench/formality_score.py): CoCoA-MT's telephony then topical_chat segments, as
given. Everything is written into a temporary directory renamed to OUT_DIR when complete, with
split.json (the counts) last.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
from pathlib import Path

COCOA = ("telephony", "topical_chat")


def bucket(english: str) -> int:
    """The English sentence's bucket, 0-99 (module docstring)."""
    return int(hashlib.sha256(english.strip().encode("utf-8")).hexdigest()[:8], 16) % 100


def read(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def write(path: Path, lines: list[str]) -> None:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")


def split(tatoeba: Path, cocoa: Path, out: Path, valid_percent: int = 2) -> dict:
    en, de = read(tatoeba / "tatoeba.en-de.en"), read(tatoeba / "tatoeba.en-de.de")
    if len(en) != len(de):
        raise SystemExit(f"{tatoeba}: tatoeba.en-de.en has {len(en)} lines but tatoeba.en-de.de {len(de)}")
    sides: dict[str, tuple[list[str], list[str]]] = {"train": ([], []), "valid": ([], [])}
    for e, d in zip(en, de):
        side = sides["valid" if bucket(e) < valid_percent else "train"]
        side[0].append(e)
        side[1].append(d)
    test = {name: [] for name in ("en", "formal.de", "informal.de", "formal.annotated.de", "informal.annotated.de")}
    domains = {}
    for domain in COCOA:
        for name, lines in test.items():
            lines += read(cocoa / f"formality-control.train.{domain}.en-de.{name}")
        domains[domain] = len(test["en"]) - sum(domains.values())
    if len({len(lines) for lines in test.values()}) != 1:
        raise SystemExit(f"{cocoa}: CoCoA-MT's files have different line counts")
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for name, (e, d) in sides.items():
        write(tmp / f"{name}.en", e)
        write(tmp / f"{name}.de", d)
    for name, lines in test.items():
        write(tmp / f"test.{name}", lines)
    counts = {"train": len(sides["train"][0]), "valid": len(sides["valid"][0]), "test": len(test["en"]),
              "valid_english": len(set(sides["valid"][0])), "valid_percent": valid_percent,
              "test_domains": domains}
    write(tmp / "split.json", [json.dumps(counts)])
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return counts


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tatoeba", type=Path, help="the Tatoeba EN-DE directory (tatoeba.en-de.en, .de)")
    parser.add_argument("cocoa", type=Path, help="the CoCoA-MT EN-DE directory")
    parser.add_argument("out", type=Path)
    parser.add_argument("--valid-percent", type=int, default=2, help="the share of English sentences in valid")
    args = parser.parse_args(argv)
    print(json.dumps(split(args.tatoeba, args.cocoa, args.out, args.valid_percent)))


if __name__ == "__main__":
    main()
