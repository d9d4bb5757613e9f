"""Terminology through lexical constraints and glossaries: term-hit rate, BLEU and speed, in
xf translate and in xf serve, as one command.

    python bench/terminology.py [--path averaged.pt] [--data ../shared/data] [--threads 1] [--out DIR]
                                [--only terminology|in-domain|speed|serve]

1. The Wiktionary set of Dinu et al. (2019) (``terminology/``: 727 newstest2017 EN-DE sentences,
   884 term pairs): the term-hit rate (the share of term pairs whose target term occurs in the
   output, as a whole word) and sacreBLEU on those sentences, beam 4, for three runs: no
   constraints, each sentence's own target terms as hard constraints (``--input-format jsonl``),
   and the 884 pairs as one glossary (``--glossary``: every source term found in any sentence
   becomes a constraint).
2. In domain, the terms the model gets wrong (Multi30k val, all 1,014 lines): the words of each
   reference that the unconstrained output lacks, each aligned to a word of its source by Dice's
   coefficient over the Multi30k training pairs (``dice_terms``: sentence co-occurrence, lowercased
   words, the best source word of the line at Dice >= 0.3 and seen together at least 3 times,
   neither word among the 100 most frequent of its side);
   every line with such a word gets its best-aligned one as a constraint. BLEU and term-hit rate
   on those lines, unconstrained against constrained.
3. The speed of constrained search against unconstrained on Multi30k val (the first 500 lines):
   beam 4 with 0, 1, 2 and 4 constraints per sentence, each a word of the sentence's reference
   (the longest not yet taken), the runs alternated for ``--rounds`` rounds, each figure its
   best round, wall time of the whole command (model loading included, the same in every run).
4. xf serve's glossaries (``--only serve``): what they change and cost. The first --sentences of
   the Wiktionary set, its 884 pairs as one glossary file, four runs alternated for ``--rounds``
   rounds, each figure its best round: a real ``xf serve --no-split-sentences`` process (a line is
   a sentence, as in a file) sent the sentences as requests of 1-5 lines from ``--concurrency``
   clients with no glossary, with the server's (``--glossary en-de=FILE``), and with the request's
   (the 884 pairs in every request: parsed, checked and compiled per request, the worst case); and
   ``xf translate --glossary FILE`` on the same lines as one file, the reference the served lines
   are compared with line by line (same constraints, same sentences: they should be the same).
   Also the microseconds a sentence of finding the terms (``glossary.find_terms`` over the
   direction's glossary, and over a request's and the direction's) against ``Glossary.constraints``.

Writes DIR/terminology.md (the tables) and prints it; every run goes through the CLI
(``xf translate``, ``xf serve``), as a user runs it. Without --path a random ``small`` model
(bench/decode.py's; outputs capped at the source length) stands in: the comparisons and costs
hold for any model, the hit rates and BLEU mean something with a trained one. The figures are only
as good as the model: a Multi30k caption model translates news poorly, so compare the rows with
each other, not with the paper.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from xf_command import write_report  # noqa: E402


def bench_module(name: str):
    """A sibling bench script as a module (one home for what it defines)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, HERE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def xf(*args, threads: int) -> float:
    """Run ``xf ARGS`` in its own process; its wall time in seconds."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "xformer_cli", *map(str, args)], check=True, env=env)
    return time.perf_counter() - start


def term_hits(hyps: list[str], terms: list[list[tuple[str, str]]]) -> tuple[int, int]:
    hit = total = 0
    for hyp, pairs in zip(hyps, terms):
        for _, target in pairs:
            total += 1
            hit += re.search(rf"(?<!\w){re.escape(target)}(?!\w)", hyp) is not None
    return hit, total


def bleu(hyps: list[str], refs: list[str]) -> float:
    import sacrebleu

    return sacrebleu.corpus_bleu(hyps, [refs]).score


def wiktionary(root: Path) -> tuple[list[str], list[str], list[list[tuple[str, str]]]]:
    """The Wiktionary set in ``root`` (terminology/): its sources, references and, per sentence,
    its (source term, target term) pairs."""
    src = (root / "newstest2017.en-de.en").read_text(encoding="utf-8").splitlines()
    ref = (root / "newstest2017.en-de.de").read_text(encoding="utf-8").splitlines()
    lines, terms = [], []
    for row in (root / "wikt.727.terminology.tsv").read_text(encoding="utf-8").splitlines():
        cells = [c for c in row.split("\t")]
        number = int(cells[1])
        pairs = [(cells[i], cells[i + 1]) for i in range(2, len(cells) - 1, 2) if cells[i] and cells[i + 1]]
        lines.append(number - 1)
        terms.append(pairs)
    return [src[i] for i in lines], [ref[i] for i in lines], terms


def glossary_text(terms: list[list[tuple[str, str]]]) -> str:
    """Every pair as one glossary file (xf translate --glossary): a source term's targets its forms."""
    glossary = {}
    for pairs in terms:
        for s, t in pairs:
            glossary.setdefault(s.lower(), (s, set()))[1].add(t)
    return "".join(f"{s}\t{'|'.join(sorted(ts))}\n" for s, ts in glossary.values())


def terminology(a, work: Path) -> list[str]:
    sources, refs, terms = wiktionary(a.data / "terminology")
    (work / "t.en").write_text("\n".join(sources) + "\n", encoding="utf-8")
    with open(work / "t.jsonl", "w", encoding="utf-8") as f:
        for s, pairs in zip(sources, terms):
            f.write(json.dumps({"source": s, "constraints": sorted({t for _, t in pairs})}, ensure_ascii=False) + "\n")
    (work / "glossary.tsv").write_text(glossary_text(terms), encoding="utf-8")
    common = ["translate", "--path", a.path, "--beam-size", 4, "--threads", a.threads, "--quiet"]
    runs = {
        "no constraints": [*common, "--input", work / "t.en", "--output", work / "plain.de"],
        "each sentence's terms as constraints": [*common, "--input", work / "t.jsonl", "--input-format", "jsonl",
                                                 "--output", work / "constrained.de"],
        "the 884 pairs as a glossary": [*common, "--input", work / "t.en", "--glossary", work / "glossary.tsv",
                                        "--output", work / "glossary.de"],
    }
    out = ["| run | term-hit rate | sacreBLEU | seconds |", "|---|---|---|---|"]
    for name, args in runs.items():
        seconds = xf(*args, threads=a.threads)
        hyps = Path(args[args.index("--output") + 1]).read_text(encoding="utf-8").splitlines()
        hit, total = term_hits(hyps, terms)
        out.append(f"| {name} | {hit}/{total} ({100 * hit / total:.1f}%) | {bleu(hyps, refs):.2f} | {seconds:.1f} |")
    return out


def words(line: str) -> list[str]:
    """A line's words as the term-hit count reads them (punctuation around a word dropped)."""
    return [w for w in (t.strip(".,;:!?\"'()") for t in line.split()) if w]


def dice_terms(train_src: list[str], train_tgt: list[str], sources: list[str], wanted: list[list[str]],
               threshold: float = 0.3, least: int = 3, common: int = 100) -> list[Optional[tuple[str, str, float]]]:
    """For each line, the (source word, target word, Dice) of its ``wanted`` target words best
    aligned to a word of ``sources[i]``: Dice's coefficient 2 c(s, t) / (c(s) + c(t)) over the
    training pairs (c: the pairs holding the lowercased word), at least ``threshold`` and
    c(s, t) >= ``least``, neither word among the ``common`` most frequent of its side (function
    words: "a" = "eine" is no term); None where no wanted word has one."""
    def frequent(lines):
        counts = {}
        for line in lines:
            for w in {w.lower() for w in words(line)}:
                counts[w] = counts.get(w, 0) + 1
        return set(sorted(counts, key=counts.get, reverse=True)[:common])

    stop_src, stop_tgt = frequent(train_src), frequent(train_tgt)
    targets = {t.lower() for ws in wanted for t in ws} - stop_tgt
    src_count, tgt_count, pair_count = {}, {}, {}
    for s, t in zip(train_src, train_tgt):
        ss = {w.lower() for w in words(s)}
        ts = {w.lower() for w in words(t)} & targets
        for w in ss:
            src_count[w] = src_count.get(w, 0) + 1
        for w in ts:
            tgt_count[w] = tgt_count.get(w, 0) + 1
            for v in ss:
                pair_count[v, w] = pair_count.get((v, w), 0) + 1
    out = []
    for source, ws in zip(sources, wanted):
        best = None
        for t in (t for t in ws if t.lower() in targets):
            for v in {w.lower() for w in words(source)} - stop_src:
                both = pair_count.get((v, t.lower()), 0)
                if both >= least:
                    dice = 2 * both / (src_count[v] + tgt_count[t.lower()])
                    if dice >= threshold and (best is None or dice > best[2]):
                        best = (v, t, dice)
        out.append(best)
    return out


def in_domain(a, work: Path, common: list) -> list[str]:
    m30k = a.data / "multi30k"
    read = lambda name: (m30k / name).read_text(encoding="utf-8").splitlines()  # noqa: E731
    src, ref = read("val.en"), read("val.de")
    (work / "val.en").write_text("\n".join(src) + "\n", encoding="utf-8")
    xf(*common, "--input", work / "val.en", "--output", work / "val.plain.de", threads=a.threads)
    plain = (work / "val.plain.de").read_text(encoding="utf-8").splitlines()
    missed = [[w for w in dict.fromkeys(words(r)) if len(w) > 2 and w not in set(words(h))] for r, h in zip(ref, plain)]
    terms = dice_terms(read("train.en"), read("train.de"), src, missed)
    lines = [i for i, t in enumerate(terms) if t is not None]
    with open(work / "missed.jsonl", "w", encoding="utf-8") as f:
        for i in lines:
            f.write(json.dumps({"source": src[i], "constraints": [terms[i][1]]}, ensure_ascii=False) + "\n")
    seconds = xf(*common, "--input", work / "missed.jsonl", "--input-format", "jsonl", "--output",
                 work / "missed.de", threads=a.threads)
    steered = (work / "missed.de").read_text(encoding="utf-8").splitlines()
    wanted = [[("", terms[i][1])] for i in lines]
    refs = [ref[i] for i in lines]
    out = [f"{len(lines)} of {len(src)} lines hold a reference word that the unconstrained output lacks, "
           f"aligned to a source word (examples: {', '.join(f'{terms[i][0]}={terms[i][1]}' for i in lines[:4])})", "",
           "| run | term-hit rate | sacreBLEU | seconds |", "|---|---|---|---|"]
    for name, hyps, secs in (("no constraints", [plain[i] for i in lines], None),
                             ("the aligned reference word as a constraint", steered, seconds)):
        hit, total = term_hits(hyps, wanted)
        out.append(f"| {name} | {hit}/{total} ({100 * hit / total:.1f}%) | {bleu(hyps, refs):.2f} | "
                   f"{'' if secs is None else f'{secs:.1f}'} |")
    return out


def speed(a, work: Path) -> list[str]:
    m30k = a.data / "multi30k"
    src = (m30k / "val.en").read_text(encoding="utf-8").splitlines()[: a.lines]
    ref = (m30k / "val.de").read_text(encoding="utf-8").splitlines()[: a.lines]
    files = {}
    for k in (0, 1, 2, 4):
        path = work / f"c{k}.jsonl"
        with open(path, "w", encoding="utf-8") as f:
            for s, r in zip(src, ref):
                words = sorted({w.strip(".,;:!?\"'") for w in r.split()}, key=lambda w: (-len(w), w))[:k]
                f.write(json.dumps({"source": s, "constraints": [w for w in words if w]}, ensure_ascii=False) + "\n")
        files[k] = path
    best = {k: float("inf") for k in files}
    for _ in range(a.rounds):
        for k, path in files.items():
            best[k] = min(best[k], xf("translate", "--path", a.path, "--beam-size", 4, "--threads", a.threads,
                                      "--quiet", "--input", path, "--input-format", "jsonl",
                                      "--output", work / f"c{k}.de", threads=a.threads))
    out = ["| constraints per sentence | seconds (best of rounds) | ratio to none | BLEU |", "|---|---|---|---|"]
    for k in files:
        hyps = (work / f"c{k}.de").read_text(encoding="utf-8").splitlines()
        out.append(f"| {k} | {best[k]:.1f} | {best[k] / best[0]:.2f}x | {bleu(hyps, ref):.2f} |")
    return out


def served(checkpoint: str, requests: list[list[str]], args: list[str], concurrency: int, threads: int,
           glossary: list | None = None) -> tuple[float, list[str]]:
    """(sentences/s, outputs in order) of one xf serve process answering ``requests``."""
    import http.client
    import threading
    from concurrent.futures import ThreadPoolExecutor

    flags = ["--no-split-sentences", "--threads", str(threads), "--max-len-a", "1", "--max-len-b", "0",
             "--timeout", "3600", *args]  # a loaded machine's queue waits past the default 30 s
    server = bench_module("bench_serve").Server(checkpoint, flags)
    local = threading.local()

    def ask(lines):
        if not hasattr(local, "conn"):
            local.conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=600)
        body = {"q": lines, "source": "en", "target": "de", **({"glossary": glossary} if glossary else {})}
        local.conn.request("POST", "/translate", body=json.dumps(body), headers={"Content-Type": "application/json"})
        response = local.conn.getresponse()
        answer = json.loads(response.read())
        if response.status != 200:
            raise RuntimeError(f"xf serve answered {response.status}: {answer}")
        return answer["translatedText"]

    try:
        start = time.perf_counter()
        with ThreadPoolExecutor(concurrency) as pool:
            answers = list(pool.map(ask, requests))
        elapsed = time.perf_counter() - start
    finally:
        server.stop()
    return sum(map(len, requests)) / elapsed, [text for texts in answers for text in texts]


def matching(sources: list[str], glossary_file: Path, pairs: list) -> list[str]:
    """Microseconds a sentence of finding the terms, three ways (best of 5 passes over the lines)."""
    from xformer_cli.text.glossary import Glossary, find_terms

    server = Glossary.load(str(glossary_file))
    request = Glossary.from_pairs(pairs, "glossary")
    ways = {"Glossary.constraints (xf translate)": lambda s: server.constraints(s),
            "find_terms, the direction's glossary": lambda s: find_terms(s, [server]),
            "find_terms, a request's and the direction's": lambda s: find_terms(s, [request, server])}
    out = ["| matching, 884 terms | µs a sentence |", "|---|---|"]
    for name, way in ways.items():
        best = float("inf")
        for _ in range(5):
            start = time.perf_counter()
            for s in sources:
                way(s)
            best = min(best, time.perf_counter() - start)
        out.append(f"| {name} | {best / len(sources) * 1e6:.0f} |")
    re.purge()  # a glossary not seen before: its regex compiled (re caches the last 512 patterns)
    start = time.perf_counter()
    Glossary.from_pairs(pairs, "glossary")
    compiled = time.perf_counter() - start
    start = time.perf_counter()
    Glossary.from_pairs(pairs, "glossary")
    out.append(f"| reading a request's 884 pairs (Glossary.from_pairs, once a request): new / seen before | "
               f"{compiled * 1e6:.0f} / {(time.perf_counter() - start) * 1e6:.0f} (a request) |")
    return out


def serving(a, work: Path) -> list[str]:
    """Part 4: xf serve with no glossary, the server's and the request's, against xf translate --glossary."""
    sources, _, terms = wiktionary(a.data / "terminology")
    sources, terms = sources[: a.sentences], terms[: a.sentences]
    requests = bench_module("bench_serve").requests_of(sources)
    glossary_file = work / "serve-glossary.tsv"
    glossary_file.write_text(glossary_text(terms), encoding="utf-8")
    pairs = [line.split("\t") for line in glossary_file.read_text(encoding="utf-8").splitlines()]
    (work / "serve.en").write_text("\n".join(sources) + "\n", encoding="utf-8")
    runs = {"no glossary": ([], None), "the server's (--glossary)": (["--glossary", f"en-de={glossary_file}"], None),
            "the request's (884 pairs in each)": (["--max-glossary-terms", "1000"], pairs)}
    best, outputs, reference_s = {name: 0.0 for name in runs}, {}, 0.0
    for _ in range(a.rounds):
        for name, (args, glossary) in runs.items():
            rate, outputs[name] = served(a.path, requests, args, a.concurrency, a.threads, glossary)
            best[name] = max(best[name], rate)
        seconds = xf("translate", "--path", a.path, "--input", work / "serve.en", "--output", work / "serve.de",
                     "--glossary", glossary_file, "--threads", a.threads, "--max-len-a", 1, "--max-len-b", 0, "--quiet",
                     threads=a.threads)
        reference_s = max(reference_s, len(sources) / seconds)  # model loading included
    reference = (work / "serve.de").read_text(encoding="utf-8").splitlines()
    hit, total = term_hits(reference, terms)
    lines = [f"{len(sources)} sentences, {len(requests)} requests, concurrency {a.concurrency}", "",
             "| run | sentences/s (best round) | ratio to no glossary | lines unlike xf translate --glossary's | "
             "term-hit rate |", "|---|---|---|---|---|"]
    for name in runs:
        unlike = "" if name == "no glossary" else \
            f"{sum(x != y for x, y in zip(outputs[name], reference))} of {len(reference)}"
        h, t = term_hits(outputs[name], terms)
        lines.append(f"| {name} | {best[name]:.1f} | {best[name] / best['no glossary']:.2f}x | {unlike} | {h}/{t} |")
    lines.append(f"| xf translate --glossary, one file (model loading included) | {reference_s:.1f} | "
                 f"{reference_s / best['no glossary']:.2f}x | | {hit}/{total} |")
    return [*lines, "", *matching(sources, glossary_file, pairs)]


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--path", default=None, help="the checkpoint (EN-DE); default: a random small model")
    ap.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data",
                    help="a folder with terminology/ and multi30k/ (default ../shared/data)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads of xf translate and xf serve")
    ap.add_argument("--lines", type=int, default=500, help="Multi30k val lines of the speed runs")
    ap.add_argument("--sentences", type=int, default=200, help="the serve part: the first N of the set's 727")
    ap.add_argument("--concurrency", type=int, default=8, help="the serve part's clients")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--only", choices=("terminology", "in-domain", "speed", "serve"), default=None,
                    help="run one part (default: all four)")
    ap.add_argument("--out", type=Path, default=None, help="where terminology.md goes (default: a temporary folder)")
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="xf-terms-") as tmp:
        work = Path(tmp)
        flags = " ".join(sorted(set(re.findall(r"\b(avx2|avx512f|avx512_vnni|avx512_bf16|amx_int8|amx_bf16)\b",
                                              Path("/proc/cpuinfo").read_text())))) if Path("/proc/cpuinfo").exists() else "?"
        model = a.path or "a random small model"
        a.path = a.path or bench_module("decode").random_checkpoint(work)
        common = ["translate", "--path", a.path, "--beam-size", 4, "--threads", a.threads, "--quiet"]
        parts = {
            "terminology": lambda: ["## The Wiktionary set (Dinu et al. 2019), 727 sentences", "",
                                    *terminology(a, work), ""],
            "in-domain": lambda: ["## In domain: Multi30k val, the words the model gets wrong", "",
                                  *in_domain(a, work, common), ""],
            "speed": lambda: [f"## Speed: Multi30k val, {a.lines} lines, {a.rounds} rounds", "", *speed(a, work), ""],
            "serve": lambda: [f"## xf serve's glossaries: the Wiktionary set, {a.rounds} round(s)", "",
                              *serving(a, work), ""],
        }
        text = "\n".join([f"# Terminology: {model}, beam 4, {a.threads} thread(s); CPU flags: {flags}", "",
                          *(line for name, part in parts.items() if a.only in (None, name) for line in part())])
    write_report(text, a.out, "terminology.md")


if __name__ == "__main__":
    main(sys.argv[1:])
