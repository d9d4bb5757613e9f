"""CTranslate2, xf's second engine: a directory that ``xf export ctranslate2`` wrote, checked
(``read_exported_model``: CTranslate2's own errors do not name the file), and ``xf translate``'s
search over it (``CTranslate2Engine``), with xf's search rules where CTranslate2 allows them.
The directory's writer is ``formats.ctranslate2``. This module never imports ctranslate2 at the
top: it is an extra (``import_ctranslate2`` says how to install it).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Optional, Sequence

import torch

from ..base.errors import XfError
from ..base.json_input import read_json
from ..base.precision import ct2_compute_type, ct2_precisions, resolve_precision
from ..model.facts import from_export
from ..settings.config import file_number, option_range
from ..settings.options import ModelConfig, TranslateOptions
from ..text.vocab import BOS_ID, EOS_ID, PAD_ID, load_sentencepiece
from .engines import Engine, check_shortlist
from .search import Hypothesis, length_penalty, max_output_lengths
from .shortlist import Shortlist, vocabulary_map


def import_ctranslate2():
    """The ctranslate2 module, or a one-line error saying how to install it."""
    try:
        import ctranslate2
    except ImportError:
        raise XfError("ctranslate2 is not installed: pip install 'xformer-cli[ctranslate2]'") from None
    return ctranslate2


# -- reading ----------------------------------------------------------------------------------------
def read_exported_model(path: Path) -> dict:
    """xf.json of a directory written by xf export, after checking what CTranslate2 would report
    without naming the file: config.json and xf.json must be JSON objects, and spm.model must be
    the one exported (xf.json's spm_sha256). Returns xf.json's dict."""
    found = {}
    for name in ("config.json", "xf.json"):
        found[name] = read_json(path / name, hint="export the model again")
        if not isinstance(found[name], dict):
            raise XfError(f"{path / name}: not a JSON object; export the model again")
    info = found["xf.json"]
    try:
        file_number(info, "max_positions", str(path / "xf.json"), int, option_range(ModelConfig, "max_positions"))
    except XfError as e:
        raise XfError(f"{e}; export the model again") from None
    if not isinstance(info.get("languages", {}), dict):
        raise XfError(f"{path / 'xf.json'}: 'languages' is not a JSON object; export the model again")
    try:
        spm_bytes = (path / "spm.model").read_bytes()
    except OSError as e:
        raise XfError(f"{path / 'spm.model'}: unreadable ({e.strerror or e}); export the model again") from None
    recorded = info.get("spm_sha256")
    if recorded and hashlib.sha256(spm_bytes).hexdigest() != recorded:
        raise XfError(f"{path / 'spm.model'}: not the sentencepiece model this directory was exported with (its sha256 "
                      "differs from xf.json's spm_sha256); export the model again")
    return info


# -- the engine -------------------------------------------------------------------------------------
def _with_vocabulary_map(model_dir: Path, shortlist_path: str, sp):
    """A temporary directory of links to model_dir's files plus the shortlist as vmap.txt:
    CTranslate2 reads its vocabulary map from the model directory, which stays untouched."""
    import os
    import tempfile

    shortlist = Shortlist.load(shortlist_path)
    check_shortlist(shortlist, shortlist_path, sp)
    tmp = tempfile.TemporaryDirectory(prefix="xf-ct2-vmap-")
    for f in model_dir.iterdir():
        if f.name != "vmap.txt":
            os.symlink(f.resolve(), Path(tmp.name) / f.name)
    (Path(tmp.name) / "vmap.txt").write_text(vocabulary_map(shortlist, [sp.id_to_piece(i) for i in range(sp.get_piece_size())]),
                                             encoding="utf-8")
    return tmp


class CTranslate2Engine(Engine):
    """xf translate's search over an exported model, with xf's rules where CTranslate2 allows:

    - CTranslate2 returns its beam_size finished hypotheses (it also stops at beam_size finished,
      as xf) with their log-probabilities (length_penalty 0: no normalization), which xf re-ranks
      with its own length penalty (GNMT by default; CTranslate2's is |Y|^alpha);
    - CTranslate2 never forces eos at the length limit: a hypothesis that stops there is given
      its eos by ``score_batch``, which scores it, as xf would; jsonl output takes every
      hypothesis's per-token log-probabilities from ``score_batch`` too;
    - empty outputs are allowed (min_decoding_length 0), as in xf;
    - the length limit a*|X|+b is one per CTranslate2 call: a batch runs at its longest
      sentence's limit, and a sentence with a hypothesis beyond its own limit runs again alone;
    - pad and bos are suppressed, as in xf. Sampling and ensembles are xf-engine only;
    - target prefixes are its target_prefix; --alternatives its return_alternatives, which
      completes each alternative with its one best hypothesis by log-probability (length_penalty
      0), where xf's is the best by --lenpen: the two agree at --lenpen 0 or beam 1.
    """

    def __init__(self, translator, sp, max_positions: int, vocabulary_map=None):
        self.translator, self.sp = translator, sp
        self.vocabulary_map = vocabulary_map  # the directory CTranslate2 read vmap.txt from, or None
        self.max_positions = max_positions
        self.device = torch.device("cpu")
        self.max_source = max_positions - 1  # room for the source's eos
        self.pieces = [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
        self.ids = {p: i for i, p in enumerate(self.pieces)}

    @classmethod
    def open(cls, path: str | Path, device: str = "auto", precision: str = "auto", quantize: str = "none",
             threads: int = 0, workers: int = 1, shortlist: Optional[str] = None):
        """(engine, sentencepiece processor) of the directory ``path`` written by xf export
        ctranslate2: on ``device`` (auto, cpu, cuda) in ``precision`` (resolve_precision's rule
        for this engine), ``workers`` parallel batches (CTranslate2's inter_threads) sharing
        ``threads`` (0: CTranslate2's default), candidates limited to the shortlist file
        ``shortlist`` (its vocabulary map)."""
        ct2 = import_ctranslate2()
        path = Path(path)
        if not (path / "model.bin").is_file() or not (path / "xf.json").is_file():
            raise XfError(f"{path}: not a model directory written by xf export ctranslate2")
        info = read_exported_model(path)
        sp = load_sentencepiece((path / "spm.model").read_bytes(), str(path / "spm.model"))
        if device == "auto":
            device = "cuda" if ct2.get_cuda_device_count() > 0 else "cpu"
        if device == "cuda" and ct2.get_cuda_device_count() == 0:
            raise XfError("--device cuda: no CUDA device is available to CTranslate2")
        available = ct2_precisions(set(ct2.get_supported_compute_types(device)))
        precision = resolve_precision(torch.device(device), precision, quantize, available, "ctranslate2")
        compute_type = ct2_compute_type(precision, quantize)
        vmap = None
        if shortlist is not None:
            vmap = _with_vocabulary_map(path, shortlist, sp)
        try:
            intra = threads  # 0: CTranslate2's default
            if workers > 1:
                intra = max(1, (threads or torch.get_num_threads()) // workers)
            translator = ct2.Translator(vmap.name if vmap else str(path), device=device, compute_type=compute_type,
                                        intra_threads=intra, inter_threads=workers)
        except (RuntimeError, ValueError) as e:  # a damaged model.bin: "invalid payload size", ...
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise XfError(f"{path / 'model.bin'}: damaged CTranslate2 model ({first}); export it again") from None
        engine = cls(translator, sp, int(info["max_positions"]), vmap)
        engine.device = torch.device(device)
        engine.facts = from_export(info, path)  # exports before languages were recorded: bilingual
        return engine, sp

    def search(self, sentences: Sequence[Sequence[int]], options: TranslateOptions, generator=None,
               prefixes: Optional[Sequence[Sequence[int]]] = None, constraints=None) -> list[list[Hypothesis]]:
        """As ``Engine.search``; a target prefix is CTranslate2's target_prefix, alternatives its
        return_alternatives (the prefix raises a sentence's length limit to its length, as xf).
        CTranslate2 has no lexical constraints."""
        lengths = torch.tensor([len(s) for s in sentences])
        limits = max_output_lengths(lengths, options.max_len_a, options.max_len_b, self.max_positions).tolist()
        sources = [[self.pieces[t] for t in s] for s in sentences]
        targets = [[self.pieces[t] for t in p] for p in prefixes] if prefixes else [[] for _ in sentences]
        limits = [max(limit, len(p)) for limit, p in zip(limits, targets)]
        results = self._search(sources, targets, max(limits), options)
        again: dict[int, list[int]] = {}  # limit -> sentences with a hypothesis beyond their own limit
        for i, limit in enumerate(limits):
            if limit < max(limits) and any(len(tokens) > limit for tokens, _ in results[i]):
                again.setdefault(limit, []).append(i)
        for limit, idx in again.items():
            for i, hyps in zip(idx, self._search([sources[i] for i in idx], [targets[i] for i in idx], limit, options)):
                results[i] = hyps
        return self._rank(sources, results, options)

    def _search(self, sources: list[list[str]], targets: list[list[str]], limit: int,
                options: TranslateOptions) -> list[list[tuple]]:
        """(tokens without eos, log-probability with eos or None) of the beam_size hypotheses
        CTranslate2 finishes per sentence (with alternatives: one per alternative); None where it
        stopped at the limit without eos. targets: each sentence's target prefix (pieces)."""
        if limit == 0:
            return [[((), None)] for _ in sources]  # only eos may follow bos
        eos = self.pieces[EOS_ID]
        steer = dict(target_prefix=targets) if any(targets) or options.alternatives else {}
        out = self.translator.translate_batch(
            sources, beam_size=options.beam_size, num_hypotheses=options.alternatives or options.beam_size,
            length_penalty=0.0, max_decoding_length=limit, min_decoding_length=0, return_end_token=True,
            return_scores=True, return_alternatives=bool(options.alternatives),
            suppress_sequences=[[self.pieces[PAD_ID]], [self.pieces[BOS_ID]]], use_vmap=self.vocabulary_map is not None,
            **steer,
        )
        return [[(tuple(h[:-1]), score) if h and h[-1] == eos else (tuple(h), None)
                 for h, score in zip(r.hypotheses, r.scores)] for r in out]

    def _rank(self, sources: list[list[str]], results: list[list[tuple]], options: TranslateOptions) -> list[list[Hypothesis]]:
        """Rank each sentence's hypotheses by xf's length penalty. score_batch (one call) scores
        the hypotheses cut at the limit (with a forced eos) and, for jsonl, every hypothesis, for
        its per-token log-probabilities; text output leaves positional_scores empty. Alternatives
        stay in CTranslate2's order (most likely first token first), one each."""
        per_token = options.output_format == "jsonl"
        todo = [(i, j) for i, hyps in enumerate(results) for j, (_, score) in enumerate(hyps) if per_token or score is None]
        scored = self.translator.score_batch([sources[i] for i, _ in todo], [list(results[i][j][0]) for i, j in todo]) if todo else []
        positional = {key: list(r.log_probs) for key, r in zip(todo, scored)}  # eos included
        out = []
        for i, hyps in enumerate(results):
            ranked, seen = [], set()
            for j, (tokens, score) in enumerate(hyps):
                if tokens in seen and not options.alternatives:
                    continue
                seen.add(tokens)
                pos = positional.get((i, j), [])
                total = sum(pos) if pos else score  # score_batch's sum where there is one (closer to xf's)
                ids = [self.ids[p] for p in tokens] + [EOS_ID]
                ranked.append(Hypothesis(ids, total / length_penalty(len(ids), options.lenpen, options.lenpen_style), pos))
            if options.alternatives:
                out.append(ranked)
                continue
            ranked.sort(key=lambda h: -h.score)
            out.append(ranked[: options.nbest])
        return out
