"""Inline tags through xf serve's format html: word alignment against placeholders (docs/serve.md).

50 test2016 EN sentences holding a word of a small EN->DE lexicon, that word wrapped in <b> (and a
second one, where there is one, in <i>); a tag is in place when the translation's tag wraps the
lexicon's German word, counted over the tags whose German word the translation holds at all.
Methods: "alignment" (format html, the tags placed by the best hypothesis's word alignment),
"relative" (format html without alignments: the same relative position, as for ctranslate2),
"placeholders" (the tags left in the text, format text: the model copies them or not).

    python bench/html_tags.py CHECKPOINT [test2016.en]
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
from pathlib import Path

from xformer_cli.settings.config import build_options
from xformer_cli.settings.options import ServeOptions
from xformer_cli.serve.server import Server
from xformer_cli.serve.directions import load_directions

LEXICON = {"man": "mann", "woman": "frau", "dog": "hund", "girl": "mädchen", "boy": "junge", "water": "wasser",
           "street": "straße", "red": "rot", "blue": "blau", "child": "kind", "hat": "hut", "ball": "ball",
           "white": "weiß", "black": "schwarz", "two": "zwei", "three": "drei", "small": "klein", "young": "jung",
           "group": "gruppe", "beach": "strand", "car": "auto", "green": "grün", "snow": "schnee"}


def test_set(lines: list[str], size: int = 50) -> list[tuple[str, list[str]]]:
    """(sentence with tags, the German stems the tags should wrap, in tag order b, i)."""
    out = []
    for line in lines:
        words = line.split()
        hits = [k for k, w in enumerate(words) if w.lower() in LEXICON][:2]
        if not hits:
            continue
        for tag, k in zip(("b", "i"), hits):
            words[k] = f"<{tag}>{words[k]}</{tag}>"
        out.append((" ".join(words), [LEXICON[line.split()[k].lower()] for k in hits]))
        if len(out) == size:
            break
    return out


async def call(app, body: dict) -> dict:
    sent, messages = [], [{"type": "http.request", "body": json.dumps(body).encode(), "more_body": False}]

    async def receive():  # the body, then a client that waits for its answer
        if messages:
            return messages.pop(0)
        await asyncio.Event().wait()

    async def send(message):
        sent.append(message)
    scope = {"type": "http", "method": "POST", "path": "/translate", "headers": [(b"content-type", b"application/json")],
             "query_string": b"", "http_version": "1.1", "scheme": "http", "root_path": "", "server": ("127.0.0.1", 1),
             "client": ("127.0.0.1", 2)}
    await app(scope, receive, send)
    return json.loads(b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body"))


def score(outputs: list[str], items) -> tuple[int, int, int]:
    """(in place, measurable, balanced outputs)."""
    placed = measurable = balanced = 0
    for out, (_, stems) in zip(outputs, items):
        plain = re.sub(r"<[^>]*>", "", out).lower()
        balanced += all(out.count(f"<{t}>") == out.count(f"</{t}>") == 1 for t in ("b", "i")[:len(stems)])
        for tag, stem in zip(("b", "i"), stems):
            if stem not in plain:
                continue
            measurable += 1
            inside = re.search(f"<{tag}>(.*?)</{tag}>", out)
            placed += bool(inside and stem in inside.group(1).lower())
    return placed, measurable, balanced


def main(checkpoint: str, source: str) -> None:
    items = test_set(Path(source).read_text(encoding="utf-8").splitlines())
    options = build_options(ServeOptions, {"model": [f"en-de={checkpoint}"], "max_wait_ms": 0}, "bench")
    directions = load_directions(options)
    server = Server(directions, options, [])
    server.queue.start()
    try:
        app = server.app()
        html = [q for q, _ in items]
        engine = directions[0].engine

        async def three() -> dict:  # one event loop: the server's events belong to it
            runs = {"alignment": await call(app, {"q": html, "source": "en", "target": "de", "format": "html"})}
            engine.supports_alignments = False
            runs["relative"] = await call(app, {"q": html, "source": "en", "target": "de", "format": "html"})
            engine.supports_alignments = True
            runs["placeholders"] = await call(app, {"q": html, "source": "en", "target": "de", "format": "text"})
            return runs
        runs = asyncio.run(three())
    finally:
        server.queue.stop()
    for name, answer in runs.items():
        if "error" in answer:
            raise SystemExit(f"{name}: {answer}")
        placed, measurable, balanced = score(answer["translatedText"], items)
        print(f"{name:13s} tags in place {placed}/{measurable} ({placed / max(measurable, 1):.0%}) | "
              f"outputs with every tag once, balanced {balanced}/{len(items)}")
    for q, a, p in list(zip(html, runs["alignment"]["translatedText"], runs["placeholders"]["translatedText"]))[:3]:
        print(f"  {q}\n  alignment:    {a}\n  placeholders: {p}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "../shared/data/multi30k/test2016.en")
