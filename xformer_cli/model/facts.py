"""What a model is, read once: ``ModelFacts``, the one record every consumer asks (STYLE 21).

A checkpoint's facts are its ``model_config`` (sizes, positions, sinusoids, decoder start,
tying, LayerNorm placement), its ``meta`` (the languages: a bilingual model's ``source_lang`` /
``target_lang``, a multilingual one's ``pairs``, whose sources start with a target tag) and its
vocabulary (one sentencepiece model, or a mapped pair from xf import huggingface). From them the
record derives, once, what each export format can hold: ``export_refusal(format)`` is None, or
one line naming every option the format cannot hold. ``xf export`` takes its languages from here
(a flag may confirm them, never override them), ``xf serve`` its directions, ``--target-lang``
its choices, alignments their rule for the tag. A CTranslate2 directory's facts come from its own
``xf.json`` (``from_export``): its languages and longest sequence; the architecture is then
CTranslate2's to know and left None. Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from ..base.errors import XfError
from ..settings.options import CONVENTIONS
from ..text.formality_tags import with_formality
from ..text.languages import LANGUAGE_KEYS, languages_of, model_pairs, pair_names, same_language, tag, vocabulary_for

FORMATS = ("ctranslate2", "argos", "huggingface", "marian", "bergamot")
MARIAN_ACTIVATIONS = ("relu", "gelu", "swish")  # MarianMT's and Marian's feed-forward activations
RUNTIMES = {"argos": "an Argos package", "marian": "Marian's decoder", "bergamot": "Bergamot"}


@dataclass(frozen=True)
class ModelFacts:
    """One model's facts; ``where`` (its path) names it in errors. ``pairs``: the directions it
    was trained on, each (source, target): one for a bilingual model whose meta records its
    languages, none when it records none, several (or one) for a multilingual model, whose every
    source starts with its target's tag (``tagged``)."""

    where: str
    pairs: tuple[tuple[str, str], ...] = ()
    multilingual: bool = False
    vocabulary_kind: Optional[str] = None  # "sentencepiece", or "mapped" (two models over one id space)
    positions: Optional[str] = None
    sinusoids: Optional[str] = None
    decoder_start: Optional[str] = None
    share_embeddings: Optional[str] = None
    normalize_before: Optional[bool] = None
    scale_embedding: Optional[bool] = None
    activation: Optional[str] = None
    d_model: Optional[int] = None
    heads: Optional[int] = None
    head_dim: Optional[int] = None
    encoder_layers: Optional[int] = None
    decoder_layers: Optional[int] = None
    vocab_size: Optional[int] = None
    max_positions: Optional[int] = None
    formality: Optional[str] = None  # the language whose address its formality tags choose (text/formality_tags.py)
    exports: tuple[tuple[str, Optional[str]], ...] = ()  # (format, None or the one-line reason it cannot go there)

    @property
    def tagged(self) -> bool:
        """Every non-empty source starts with a target tag: the tag is no word, so an alignment
        never points at it and source positions count from the sentence's first subword."""
        return self.multilingual

    @property
    def sources(self) -> list[str]:
        return list(dict.fromkeys(s for s, _ in self.pairs))

    @property
    def targets(self) -> list[str]:
        return list(dict.fromkeys(t for _, t in self.pairs))

    @property
    def tags(self) -> list[str]:
        """The target tags a multilingual model's sources start with (none for a bilingual one)."""
        return [tag(t) for t in self.targets] if self.multilingual else []

    def describe(self) -> str:
        return ", ".join(pair_names(self.pairs)) if self.pairs else "no recorded languages"

    def own(self, source: str, target: str) -> tuple[str, str]:
        """(source, target) in the codes the model records (``deu`` -> ``de`` where it records
        ``de``: ISO 639-1 and 639-3 name one language alike); a code it does not know as given."""
        def mine(code: str, codes: list[str]) -> str:
            return next((c for c in codes if same_language(c, code)), code)
        return mine(source, self.sources), mine(target, self.targets)

    def translates(self, source: str, target: str) -> bool:
        """Whether (source, target) is one of the model's directions, or, multilingual, a zero-shot
        one from one of its sources into one of its targets (either ISO 639-1 or 639-3: ``own``).
        A model that records no languages translates whatever it is named to."""
        if not self.pairs:
            return True
        source, target = self.own(source, target)
        if self.multilingual:
            return source in self.sources and target in self.targets
        return (source, target) in self.pairs

    def vocabulary(self, sp, target_lang: Optional[str], where: Optional[str] = None,
                   formality: Optional[str] = None):
        """The vocabulary translating into ``target_lang`` (``languages.vocabulary_for``): ``sp``
        for a bilingual model (a --target-lang other than its own refused), a ``TaggedVocabulary``
        putting the target's tag first for a multilingual one (--target-lang one of its targets);
        with ``formality`` (formal, informal) its formality tag next (``formality_tags``: refused
        by a model without them)."""
        where = where or self.where
        vocabulary = vocabulary_for(sp, languages_meta(self), target_lang, where)  # the language first
        if formality is None:
            return vocabulary
        tagged = with_formality(sp, formality, self.formality, getattr(vocabulary, "target_lang", None), where)
        return vocabulary_for(tagged, languages_meta(self), target_lang, where)

    def export_refusal(self, fmt: str) -> Optional[str]:
        return dict(self.exports).get(fmt)

    def refuse_export(self, fmt: str) -> None:
        """The one-line error of a format the model cannot go to, naming every reason at once."""
        reason = self.export_refusal(fmt)
        if reason:
            raise XfError(f"xf export {fmt}: {self.where}: {reason}")


def facts_of(ckpt: dict, where: str | Path = "checkpoint") -> ModelFacts:
    """The facts of a loaded checkpoint (``checkpoint.load_checkpoint``'s dict)."""
    from ..settings.config import build_options
    from ..settings.options import ModelConfig
    from ..text.vocab import MappedVocabulary, load_sentencepiece

    spm = ckpt.get("spm_model")
    mapped = spm is not None and isinstance(load_sentencepiece(spm, str(where)), MappedVocabulary)
    return facts_from_config(build_options(ModelConfig, dict(ckpt["model_config"]), "model config"),
                             ckpt.get("meta") or {}, mapped, where)


def facts_from_config(cfg, meta: Optional[dict] = None, mapped: bool = False,
                      where: str | Path = "checkpoint") -> ModelFacts:
    """The facts of a model of configuration ``cfg`` (a ModelConfig) whose checkpoint ``meta``
    records its languages; ``mapped``: its vocabulary is a mapped pair of sentencepiece models."""
    meta = languages_of(meta or {})
    pairs = model_pairs(meta)
    facts = ModelFacts(
        where=str(where), pairs=tuple(pairs) if pairs is not None else _bilingual(meta),
        multilingual=pairs is not None, vocabulary_kind="mapped" if mapped else "sentencepiece",
        positions=cfg.positions, sinusoids=cfg.sinusoids, decoder_start=cfg.decoder_start,
        share_embeddings=cfg.share_embeddings, normalize_before=cfg.normalize_before,
        scale_embedding=cfg.scale_embedding, activation=cfg.activation, d_model=cfg.d_model, heads=cfg.heads,
        head_dim=cfg.head_dim, encoder_layers=cfg.encoder_layers, decoder_layers=cfg.decoder_layers,
        vocab_size=cfg.vocab_size, max_positions=cfg.max_positions, formality=meta.get("formality"))
    return _with_exports(facts)


def from_export(info: dict, where: str | Path) -> ModelFacts:
    """The facts a CTranslate2 directory's ``xf.json`` records (``formats.ctranslate2``): its
    languages (none in exports older than their record: bilingual) and its longest sequence."""
    languages = languages_of(info.get("languages") or {})
    pairs = model_pairs(languages)
    return ModelFacts(where=str(where), pairs=tuple(pairs) if pairs is not None else _bilingual(languages),
                      multilingual=pairs is not None, max_positions=info.get("max_positions"),
                      formality=languages.get("formality"))


def read_facts(path: str | Path) -> ModelFacts:
    """The facts of the checkpoint at ``path`` without loading its weights into a model (memory-
    mapped); a CTranslate2 directory's: ``from_export(decode.ctranslate2_engine.read_exported_model(path))``."""
    from .checkpoint import load_checkpoint

    return facts_of(load_checkpoint(path, mmap=True), path)


def languages_meta(facts: ModelFacts) -> dict:
    """The facts' languages as a checkpoint's meta records them (``languages.LANGUAGE_KEYS``):
    what ``languages.vocabulary_for`` chooses a direction's vocabulary by."""
    if facts.multilingual:
        return {"pairs": pair_names(facts.pairs)}
    return dict(zip(LANGUAGE_KEYS[:2], facts.pairs[0])) if facts.pairs else {}


def _bilingual(meta: dict) -> tuple[tuple[str, str], ...]:
    source, target = meta.get("source_lang"), meta.get("target_lang")
    return ((source, target),) if source and target else ()


# -- what each format can hold -----------------------------------------------------------------------
# A reason a format cannot hold a model: (the phrase that says why, the training flags a model made
# with them would not have it: none where no flag helps, as for a mapped vocabulary).
Reason = tuple[str, tuple[str, ...]]
# The flags of the options a fine-tune may carry a trained model over to (xf train --init-from-convert).
CONVERTIBLE = tuple(f"--{name.replace('_', '-')} " for name in CONVENTIONS)


def marian_architecture(facts: ModelFacts, target: str, sinusoids: str, decoder_start: str) -> list[Reason]:
    """Every option of ``facts`` that ``target`` (MarianMT, or Marian: one architecture that differs in
    ``sinusoids`` and ``decoder_start``) cannot compute. The two conventions are one reason, so that
    a model lacking both is told both at once."""
    theirs = [(option, mine, wanted) for option, mine, wanted in (
        ("--sinusoids", facts.sinusoids, sinusoids), ("--decoder-start", facts.decoder_start, decoder_start))
        if mine != wanted]
    out = []
    if theirs:
        fix = tuple(f"{option} {wanted}" for option, _, wanted in theirs)
        out.append((f"{' '.join(f'{option} {mine}' for option, mine, _ in theirs)} cannot be exported to {target}, "
                    f"which computes {' '.join(fix)}", fix))
    if facts.positions != "sinusoidal":
        out.append((f"--positions {facts.positions} cannot be exported to {target} (static sinusoids only)",
                    ("--positions sinusoidal",)))
    if facts.activation not in MARIAN_ACTIVATIONS:
        out.append((f"--activation {facts.activation} cannot be exported to {target} "
                    f"({', '.join(MARIAN_ACTIVATIONS)} only)", ("--activation relu",)))
    if facts.d_model % 2:
        out.append((f"--d-model {facts.d_model} is odd; {target}'s sinusoids need an even width", ()))
    if facts.head_dim and facts.head_dim * facts.heads != facts.d_model:
        out.append((f"--head-dim {facts.head_dim} (heads x head_dim != d_model) cannot be exported to {target}, "
                    "whose heads split d_model", ()))
    return out


def marian_reasons(facts: ModelFacts) -> list[Reason]:
    """What Marian's transformer (and so Bergamot's engine) cannot hold. Its pre-LN decoder attends
    over un-normalized states of earlier positions when it decodes step by step
    (src/models/transformer.h); an output projection of its own (Marian's
    decoder_ff_logit_out_Wt) is translated differently from xf by Marian and Bergamot alike
    (docs/benchmarks.md), so it is refused until the export's fault is found."""
    out = []
    if facts.vocabulary_kind == "mapped":
        out.append(("its vocabulary is a mapped one (two sentencepiece models, from xf import huggingface); Marian "
                    "reads one sentencepiece model's own ids", ()))
    if facts.normalize_before:
        out.append(("--normalize-before (pre-LN) cannot be exported to Marian, whose pre-LN decoder attends over "
                    "un-normalized states of earlier positions when it decodes step by step", ("--no-normalize-before",)))
    out += marian_architecture(facts, "Marian", "tensor2tensor", "zero")
    if facts.scale_embedding is False:
        out.append(("--scale-embedding false cannot be exported to Marian, which always scales embeddings by "
                    "sqrt(d_model)", ("--scale-embedding",)))
    if facts.share_embeddings == "none":
        out.append(("an output projection of its own (--share-embeddings none) is not translated as xf translates "
                    "it by Marian or Bergamot's engine (--share-embeddings decoder also exports)",
                    ("--share-embeddings all",)))
    return out


def format_reasons(facts: ModelFacts, fmt: str) -> list[Reason]:
    """Every reason ``facts`` cannot go to format ``fmt``, in one list (empty: it can)."""
    out = []
    if facts.multilingual and fmt in RUNTIMES:
        out.append((f"multilingual ({facts.describe()}) and {RUNTIMES[fmt]} has no step that starts a source with "
                    "its target tag; export it as ctranslate2 or huggingface", ()))
    if fmt in ("ctranslate2", "argos") and facts.positions in ("rope", "alibi"):
        out.append((f"{facts.positions} positions cannot be exported to CTranslate2 (sinusoidal or learned only)",
                    ("--positions sinusoidal",)))
    if fmt == "huggingface":
        if facts.normalize_before:
            out.append(("--normalize-before (pre-LN) cannot be exported to MarianMT, which is post-LN",
                        ("--no-normalize-before",)))
        out += marian_architecture(facts, "MarianMT", "paper", "bos")
    if fmt in ("marian", "bergamot"):
        out += marian_reasons(facts)
    return out


def refusal(facts: ModelFacts, reasons: list[Reason]) -> Optional[str]:
    """One line of every reason, then every flag that retraining needs, at once; where the flags
    are only the conventions (CONVERTIBLE), the fine-tune that carries the trained model over too."""
    if not reasons:
        return None
    flags = " ".join(dict.fromkeys(flag for _, fix in reasons for flag in fix))
    line = "; ".join(phrase for phrase, _ in reasons)
    if not flags:
        return line
    line += f"; retrain with {flags}"
    if all(fix and all(flag.startswith(CONVERTIBLE) for flag in fix) for _, fix in reasons):
        line += f", or fine-tune it to them: xf train DATA --init-from {facts.where} --init-from-convert {flags}"
    return line


def _with_exports(facts: ModelFacts) -> ModelFacts:
    from dataclasses import replace

    return replace(facts, exports=tuple((fmt, refusal(facts, format_reasons(facts, fmt))) for fmt in FORMATS))
