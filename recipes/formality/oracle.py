"""The validation sources as jsonl, each with the formality its reference shows: the input of
``xf translate --input-format jsonl`` that asks the tagged model for the address the reference
has (the classifier's label, ``text/formality.py``, reading the English source too); a line
whose reference has no address asks for nothing.

    python oracle.py valid.en valid.de valid.oracle.jsonl
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from xformer_cli.base.fileio import atomic_write_text
from xformer_cli.text.formality import FORMALITIES, classify


def oracle(sources: list[str], references: list[str]) -> list[str]:
    out = []
    for source, reference in zip(sources, references, strict=True):
        record = {"source": source}
        label = classify(reference, source)
        if label in FORMALITIES:
            record["formality"] = label
        out.append(json.dumps(record, ensure_ascii=False))
    return out


def main(argv=None) -> None:
    src, ref, out = (Path(a) for a in (argv or sys.argv[1:]))
    lines = oracle(src.read_text(encoding="utf-8").splitlines(), ref.read_text(encoding="utf-8").splitlines())
    atomic_write_text(out, "".join(line + "\n" for line in lines))


if __name__ == "__main__":
    main()
