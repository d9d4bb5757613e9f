"""The options of every subcommand and of the model, as frozen dataclasses (config as data).

Each field is a YAML key and a CLI flag of the same name (``max_tokens`` / ``--max-tokens``);
the help text is shown by ``xf CMD --help``. Every int and float field has a ``range``
(``config.Range``: finite, and within what the code that uses it can hold), checked by
``config.check_ranges``, first thing in every ``__post_init__`` (YAML, flags and ``dataclasses.replace``
alike); the rules between fields follow it there.
Both raise a ConfigError of one line naming the option. This module imports neither torch nor the CLI, so ``xf --help`` and
``xf score`` start fast; that is why the model's configuration lives here and not in model/transformer.py.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Optional

from ..base.errors import ConfigError, XfError
from .config import INT_MAX, Range, build_options, check_ranges, option


# Ranges shared by many options (every int and float option has one: config.Range)
COUNT = Range(0, INT_MAX)  # a count where 0 means off, all or no limit
COUNT1 = Range(1, INT_MAX)
LAYERS = Range(1, 1000)
PROBABILITY = Range(0, 1, hi_open=True)
THREADS = Range(0, 4096)


# -- the model ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int = option(37000, "joint source+target vocabulary size", range=Range(1, INT_MAX))
    encoder_layers: int = option(6, "N encoder layers", range=LAYERS)
    decoder_layers: int = option(6, "N decoder layers", range=LAYERS)
    d_model: int = option(512, "model width", range=Range(1, 65536))
    d_ff: int = option(2048, "inner width of the position-wise feed-forward network", range=Range(1, 1 << 20))
    heads: int = option(8, "attention heads h", range=Range(1, 1024))
    head_dim: Optional[int] = option(
        None, "d_k = d_v, the size of each head (default: d_model / heads); Table 3 row B shrinks it",
        range=Range(1, 65536),
    )
    dropout: float = option(0.1, "P_drop on embeddings+positions and every sub-layer output", range=PROBABILITY)
    attention_dropout: float = option(0.0, "dropout on attention weights (not in the paper)", range=PROBABILITY)
    activation_dropout: float = option(0.0, "dropout after the FFN activation (not in the paper)", range=PROBABILITY)
    normalize_before: bool = option(False, "pre-LN instead of the paper's post-LN")
    activation: Literal["relu", "gelu", "swish", "swiglu"] = option(
        "relu", "FFN activation (swish: x * sigmoid(x), as MarianMT's; swiglu: gated)"
    )
    positions: Literal["sinusoidal", "learned", "rope", "alibi"] = option(
        "sinusoidal", "position information"
    )
    sinusoids: Literal["paper", "tensor2tensor"] = option(
        "paper", "sinusoidal frequencies: the paper's 10000^(-2i/d), or tensor2tensor's 10000^(-i/(d/2-1)), "
        "Marian's (xf export marian needs them)"
    )
    decoder_start: Literal["bos", "zero"] = option(
        "bos", "the decoder's first input: the embedding of bos, or a zero vector as Marian's decoder has it "
        "(xf export marian needs zero)"
    )
    max_positions: int = option(1024, "longest sequence the model accepts", range=Range(1, 1 << 20))
    share_embeddings: Literal["all", "decoder", "none"] = option(
        "all", "tie source, target and output embeddings (all), target and output (decoder)"
    )
    scale_embedding: bool = option(True, "multiply token embeddings by sqrt(d_model) (Sec. 3.4; some MarianMT "
                                   "models do not)")
    output_bias: bool = option(False, "a fixed bias on the output logits, not trained (MarianMT's "
                               "final_logits_bias; xf import huggingface sets it)")

    def __post_init__(self) -> None:
        check_ranges(self)
        if self.head_dim is None:
            if self.d_model % self.heads:
                raise ConfigError(f"d_model {self.d_model} is not divisible by heads {self.heads} (or set --head-dim)")
            # the resolved size is what checkpoints record; one written before head_dim existed
            # has no such key and gets d_model / heads here, the size it was trained with
            object.__setattr__(self, "head_dim", self.d_model // self.heads)
        if self.positions == "rope" and self.head_dim % 2:
            raise ConfigError("rope needs an even head size")


# Presets as data. base and big are Table 3 of the paper (N, d_model, d_ff, h, P_drop);
# with a 37,000-token joint vocabulary they have 63.1M and 214.2M parameters (paper: 65M, 213M).
PRESETS: dict[str, dict] = {
    "base": dict(encoder_layers=6, decoder_layers=6, d_model=512, d_ff=2048, heads=8, dropout=0.1),
    "big": dict(encoder_layers=6, decoder_layers=6, d_model=1024, d_ff=4096, heads=16, dropout=0.3),
    # CPU-sized shapes (not in the paper): small is the shape used for performance comparisons.
    "small": dict(encoder_layers=3, decoder_layers=3, d_model=256, d_ff=1024, heads=4, dropout=0.1),
    "tiny": dict(encoder_layers=2, decoder_layers=2, d_model=64, d_ff=128, heads=4, dropout=0.1),
}

# The ModelConfig fields that change how a model trains, not the function its weights compute: a
# fine-tune (xf train --init-from) may set them apart from its checkpoint, and checkpoints that
# differ only in them are one architecture (xf average-checkpoints).
REGULARIZATION = ("dropout", "attention_dropout", "activation_dropout")

# The ModelConfig fields that change what a model's weights compute but none of its weights: the
# position frequencies and the decoder's first input, Marian's conventions (xf export marian and
# bergamot need tensor2tensor and zero, huggingface the paper's and bos). A fine-tune given
# --init-from-convert may set them apart from its checkpoint and learns the change.
CONVENTIONS = ("sinusoids", "decoder_start")

# The ModelConfig fields that xf train can set on top of a preset (the vocabulary comes from the data).
MODEL_OVERRIDES = tuple(f.name for f in dataclasses.fields(ModelConfig) if f.name != "vocab_size")


def model_config(arch: str = "base", **overrides) -> ModelConfig:
    """The ModelConfig of a preset with some fields overridden (None keeps the preset's value;
    unknown names are errors)."""
    if arch not in PRESETS:
        raise ConfigError(f"unknown arch '{arch}'; choose one of {', '.join(PRESETS)}")
    values = {**PRESETS[arch], **{k: v for k, v in overrides.items() if v is not None}}
    return build_options(ModelConfig, values, f"arch '{arch}'")


def with_model_overrides(cls: type) -> type:
    """The options dataclass ``cls`` with one optional field per entry of MODEL_OVERRIDES, after
    its ``arch`` field: the model's options are declared once, in ModelConfig, and reach the CLI
    and YAML from there. None (the default) keeps the --arch preset's value."""
    hints = typing.get_type_hints(ModelConfig)
    model_fields = {f.name: f for f in dataclasses.fields(ModelConfig)}
    fields = []
    for f in dataclasses.fields(cls):
        fields.append((f.name, typing.get_type_hints(cls)[f.name],
                       dataclasses.field(default=f.default, metadata=f.metadata)))
        if f.name == "arch":
            fields += [(name, Optional[hints[name]],
                        option(None, f"{model_fields[name].metadata['help']} (default: the --arch preset's)",
                               range=model_fields[name].metadata.get("range")))
                       for name in MODEL_OVERRIDES]
    # the class's own methods, not those that @dataclass generated
    namespace = {k: v for k, v in vars(cls).items() if callable(v) and (not k.startswith("__") or k == "__post_init__")}
    namespace["__module__"] = cls.__module__
    return dataclasses.make_dataclass(cls.__name__, fields, frozen=True, namespace=namespace)


# -- the commands ------------------------------------------------------------------------------
@dataclass(frozen=True)
class PreprocessOptions:
    destdir: str = option(help="output directory (data-bin/NAME); refused if it exists and is not empty")
    source_lang: Optional[str] = option(None, "source language suffix of the raw files (default en; not with --pairs)")
    target_lang: Optional[str] = option(None, "target language suffix of the raw files (default de; not with --pairs)")
    pairs: tuple[str, ...] = option(
        (), "several languages in one model: the directions SOURCE-TARGET (en-de,en-fr; in YAML that or a list), "
        "each read from PREFIX.SOURCE / PREFIX.TARGET, or from the pair's own PREFIX.SOURCE-TARGET.SOURCE / "
        ".TARGET where those exist; every source sentence starts with its target's tag (>>deu<<), and the data "
        "directory's sides are named src and tgt")
    sampling_temperature: float = option(
        1.0, "with --pairs: xf train draws each epoch's pairs of direction i with probability proportional to "
        "(n_i/N)^(1/T): 1 takes the data as it is, larger T evens out the directions (recorded in meta.json)",
        range=Range(0, 1e6, lo_open=True))
    formality_tags: bool = option(
        False, "start each source whose German target addresses its reader with >>formal<< (Sie) or >>informal<< "
        "(du, ihr), as formality.classify labels the target (an English source decides where the German is "
        "ambiguous); other pairs stay untagged; with --pairs, after the target-language tag and for German targets "
        "only; for xf translate --formality")
    trainpref: Optional[str] = option(None, "training files prefix (PREFIX.src, PREFIX.tgt)")
    validpref: Optional[str] = option(None, "validation files prefix (comma-separated: valid, valid1, ...)")
    testpref: Optional[str] = option(None, "test files prefix (comma-separated: test, test1, ...)")
    bpe_vocab_size: Optional[int] = option(None, "joint sentencepiece BPE vocabulary size (default 37000, the paper's "
                                           "EN-DE; not with --spm-model or --vocab-from, which give the vocabulary)",
                                           range=Range(8, INT_MAX))
    bpe_sample_lines: Optional[int] = option(
        None, "training pairs sampled (both sides; with --pairs, lines of each language's file) to learn the BPE "
        "model; bounds its memory (default 2000000; not "
        "with --spm-model or --vocab-from)", range=COUNT1
    )
    spm_model: Optional[str] = option(None, "reuse this sentencepiece model instead of learning one")
    vocab_from: Optional[str] = option(None, "use this checkpoint's vocabulary (xf's or imported, joint or separate "
                                       "source/target sentencepiece models) instead of learning one: data for "
                                       "xf train --init-from")
    max_len: int = option(250, "drop training pairs longer than this many subwords on either side", range=COUNT1)
    max_len_ratio: float = option(1.5, "drop training pairs whose subword length ratio exceeds this", range=Range(1, 1e6))
    workers: int = option(1, "parallel encoding processes (also sentencepiece training threads)", range=Range(1, 1024))
    skip_invalid: bool = option(
        False, "invalid UTF-8: drop (train) or replace with U+FFFD (valid/test) and count, instead of failing"
    )
    overwrite: bool = option(False, "replace an existing non-empty destdir")
    seed: int = option(1, "seed for BPE sampling", range=COUNT)
    verify: bool = option(False, "instead of writing destdir, check it: every file against the sha256 in its "
                          "meta.json, every index against its .bin and the vocabulary")

    def __post_init__(self) -> None:
        check_ranges(self)
        if self.pairs:
            from ..text.languages import pair_names, parse_pairs

            try:  # one item a pair, however given: "en-de,en-fr", a list, --pairs repeated
                object.__setattr__(self, "pairs", tuple(pair_names(parse_pairs(",".join(self.pairs)))))
            except XfError as e:
                raise ConfigError(str(e)) from None
            given = [f"--{n.replace('_', '-')} {getattr(self, n)}" for n, side in (("source_lang", "src"),
                     ("target_lang", "tgt")) if getattr(self, n) not in (None, side)]
            if given:  # the sides are named src and tgt; each pair names its own languages
                raise ConfigError(f"--pairs names the languages of every direction: leave out {' and '.join(given)}")
            object.__setattr__(self, "source_lang", "src")
            object.__setattr__(self, "target_lang", "tgt")
        else:
            if self.sampling_temperature != 1.0:
                raise ConfigError("--sampling-temperature samples between the directions of --pairs; without "
                                  "--pairs there is one direction")
            object.__setattr__(self, "source_lang", "en" if self.source_lang is None else self.source_lang)
            object.__setattr__(self, "target_lang", "de" if self.target_lang is None else self.target_lang)
        if self.source_lang == self.target_lang:
            raise ConfigError(f"--source-lang and --target-lang are both {self.source_lang!r}")
        if self.formality_tags:
            from ..text.formality_tags import tagged_targets

            targets = [t for _, t in self.pair_list()] or [self.target_lang]
            if not tagged_targets(targets):
                raise ConfigError(f"--formality-tags labels German targets by their address (du or Sie): "
                                  f"{', '.join(targets)} is not German")
        if self.spm_model and self.vocab_from:
            raise ConfigError("--spm-model and --vocab-from both give the vocabulary: choose one")
        given = "--spm-model" if self.spm_model else "--vocab-from" if self.vocab_from else None
        for name in ("bpe_vocab_size", "bpe_sample_lines"):
            if given and getattr(self, name) is not None:  # it would be ignored: nothing is learned
                raise ConfigError(f"--{name.replace('_', '-')} sets how BPE is learned, but {given} gives the "
                                  "vocabulary and nothing is learned: leave it out")
        if not given:  # the defaults, resolved here so that the rest reads plain numbers
            object.__setattr__(self, "bpe_vocab_size", 37000 if self.bpe_vocab_size is None else self.bpe_vocab_size)
            object.__setattr__(self, "bpe_sample_lines",
                               2_000_000 if self.bpe_sample_lines is None else self.bpe_sample_lines)

    def pair_list(self) -> list[tuple[str, str]]:
        """The directions of --pairs, [("en", "de"), ("en", "fr")]; empty for a bilingual run."""
        from ..text.languages import parse_pairs

        return parse_pairs(",".join(self.pairs)) if self.pairs else []

    def languages(self) -> tuple[str, ...]:
        """The suffixes of the raw files: every language of --pairs once, else the two given."""
        pairs = self.pair_list()
        if not pairs:
            return (self.source_lang, self.target_lang)
        return tuple(dict.fromkeys(lang for pair in pairs for lang in pair))


@with_model_overrides
@dataclass(frozen=True)
class TrainOptions:
    data: str = option(help="data directory written by xf preprocess", positional=True, path=True)
    save_dir: str = option("checkpoints", "where checkpoints and logs are written", path=True)
    arch: Optional[str] = option(None, "architecture preset: base | big | small | tiny (default: base; with "
                                 "--init-from the checkpoint's model, which a preset given must match)")
    init_from: Optional[str] = option(
        None, "fine-tune: start from this checkpoint's weights (xf's or imported) with a fresh optimizer, schedule and "
        "counters; the model options are the checkpoint's (a conflicting one is an error; dropouts may change) and "
        "the data must have its vocabulary (xf preprocess --vocab-from). A checkpoint_last.pt in --save-dir resumes instead")
    init_from_convert: bool = option(
        False, "with --init-from: --sinusoids and --decoder-start given may differ from the checkpoint's (they "
        "change no weight): a fine-tune that carries a trained model over to another format's conventions, e.g. "
        "--sinusoids tensor2tensor --decoder-start zero for xf export marian|bergamot; every other model option "
        "stays the checkpoint's")
    # batching
    max_tokens: int = option(4096, "tokens per micro-batch (source or target, whichever is larger)", range=COUNT1)
    update_freq: int = option(1, "micro-batches accumulated per update", range=Range(1, 1 << 20))
    max_update: int = option(0, "stop after this many updates (0: no limit)", range=COUNT)
    max_epoch: int = option(0, "stop after this many epochs (0: no limit)", range=COUNT)
    stop_time_hours: float = option(0.0, "stop after this many hours of training wall time, resumes "
                                    "included (0: no limit)", range=Range(0, 1e5))
    # optimization
    optimizer: Literal["adam", "adamw"] = option(
        "adam", "adam: the paper's Adam; adamw: Adam with decoupled --weight-decay (fairseq's 'adam')"
    )
    adam_betas: tuple[float, ...] = option((0.9, 0.98), "Adam betas (paper: 0.9 0.98)", range=Range(0, 1, hi_open=True))
    adam_eps: float = option(1e-9, "Adam epsilon (paper: 1e-9)", range=Range(0, 1, lo_open=True))
    lr_scheduler: Literal["noam", "inverse_sqrt"] = option("noam", "learning-rate schedule")
    warmup_updates: int = option(4000, "warmup steps (paper: 4000)", range=COUNT)
    lr: Optional[float] = option(None, "inverse_sqrt: the peak learning rate, reached after warmup", range=Range(0, 10, lo_open=True))
    lr_factor: float = option(1.0, "noam: a factor on the paper's formula (paper: 1)", range=Range(0, 1000, lo_open=True))
    warmup_init_lr: float = option(1e-7, "inverse_sqrt: learning rate at step 0", range=Range(0, 10))
    label_smoothing: float = option(0.1, "label smoothing epsilon (paper: 0.1)", range=PROBABILITY)
    late_after: int = option(
        0, "late regularization: after this many updates, train with --late-dropout and/or --late-label-smoothing "
        "instead of --dropout and --label-smoothing (0: off). A run that stops by then is unchanged; one that goes "
        "on past it (a faster machine's, in a time budget) is regularized harder for its later updates", range=COUNT)
    late_dropout: Optional[float] = option(None, "P_drop after --late-after updates (default: --dropout)", range=PROBABILITY)
    late_label_smoothing: Optional[float] = option(
        None, "label smoothing epsilon after --late-after updates (default: --label-smoothing); validation loss keeps "
        "--label-smoothing, so its curve stays comparable across the switch", range=PROBABILITY)
    clip_norm: float = option(0.0, "clip gradient norm (0: off)", range=Range(0, 1e6))
    weight_decay: float = option(0.0, "decoupled weight decay (--optimizer adamw)", range=Range(0, 10))
    precision: Literal["auto", "fp32", "bf16", "fp16"] = option(
        "auto", "training precision; auto: bf16 autocast where the GPU or CPU multiplies bf16 natively "
        "(CUDA sm_80+, avx512_bf16 or AMX), else fp32; fp16 (loss-scaled) is for older GPUs")
    device: Literal["auto", "cpu", "cuda"] = option("auto", "device")
    threads: int = option(0, "CPU threads for torch (0: torch's default)", range=THREADS)
    compile: bool = option(False, "torch.compile the model (inductor, dynamic shapes: compiled once for "
                           "all batch shapes); the compile time is reported apart from the speed")
    seed: int = option(1, "random seed", range=COUNT)
    # checkpoints, validation, logging
    save_interval_updates: int = option(0, "also save checkpoint_<epoch>_<update>.pt every N updates", range=COUNT)
    save_interval_minutes: float = option(10.0, "also refresh checkpoint_last.pt every N minutes (0: off)", range=Range(0, 1e6))
    keep_last_checkpoints: int = option(10, "keep this many update checkpoints (0: all)", range=COUNT)
    validate_interval_updates: int = option(0, "validate every N updates (and at each epoch end)", range=COUNT)
    patience: int = option(0, "stop after N validations without improvement (0: off)", range=COUNT)
    patience_epsilon: float = option(
        0.0, "--patience counts a validation as an improvement only when it beats the best by more than this "
        "(validation loss in nats, or BLEU with --eval-bleu; Marian's --early-stopping-epsilon): the run stops "
        "when N validations in a row each gain less; checkpoint_best.pt still follows every improvement",
        range=Range(0, 1e6))
    eval_bleu: bool = option(False, "validation BLEU (greedy) as the best-checkpoint criterion")
    log_interval: int = option(50, "updates between log lines", range=COUNT1)
    tensorboard_logdir: Optional[str] = option(None, "write TensorBoard scalars here", path=True)
    max_nan_updates: int = option(20, "stop after this many consecutive non-finite updates", range=COUNT1)
    ddp_timeout_minutes: float = option(
        10.0, "torchrun: a process that waits this long for another (dead or hung) stops with an error", range=Range(0, 1e5, lo_open=True)
    )

    def __post_init__(self) -> None:
        check_ranges(self)
        if len(self.adam_betas) != 2:
            raise ConfigError(f"--adam-betas needs two values in [0, 1), got {list(self.adam_betas)}")
        if self.lr_scheduler == "noam" and self.warmup_updates < 1:
            raise ConfigError("--lr-scheduler noam needs --warmup-updates of at least 1")
        if self.lr_scheduler == "inverse_sqrt" and self.lr is None:
            raise ConfigError("--lr-scheduler inverse_sqrt needs a peak learning rate: --lr (e.g. 5e-4)")
        if self.lr_scheduler == "noam" and self.lr is not None:
            raise ConfigError("--lr is the peak of --lr-scheduler inverse_sqrt; noam's formula sets the peak "
                              "itself, scaled by --lr-factor")
        if self.lr_scheduler == "inverse_sqrt" and self.lr_factor != 1.0:
            raise ConfigError("--lr-factor scales noam's formula; with inverse_sqrt set the peak with --lr")
        late = self.late_dropout is not None or self.late_label_smoothing is not None
        if self.late_after and not late:
            raise ConfigError("--late-after needs --late-dropout or --late-label-smoothing (what changes from that update)")
        if late and not self.late_after:
            raise ConfigError("--late-dropout and --late-label-smoothing need --late-after (the number of updates after which they apply)")
        if self.weight_decay and self.optimizer == "adam":
            raise ConfigError("--weight-decay is decoupled weight decay: use --optimizer adamw")
        if self.arch is not None and self.arch not in PRESETS:
            raise ConfigError(f"unknown arch '{self.arch}'; choose one of {', '.join(PRESETS)}")
        if self.init_from_convert and self.init_from is None:
            raise ConfigError("--init-from-convert changes a checkpoint's conventions on a fine-tune: it needs "
                              "--init-from CHECKPOINT")
        if self.init_from is None:  # with it, the model is the checkpoint's, checked against it when it is read
            model_config(self.arch or "base", **{name: getattr(self, name) for name in MODEL_OVERRIDES})


@dataclass(frozen=True)
class AverageOptions:
    inputs: tuple[str, ...] = option(help="checkpoint directory (or directories) or checkpoint files")
    output: str = option(help="averaged checkpoint to write")
    num_update_checkpoints: int = option(
        0, "average the last N checkpoint_<epoch>_<update>.pt by update number (paper: 5 base, 20 big)", range=COUNT
    )
    num_epoch_checkpoints: int = option(0, "average the last N epoch-end checkpoints by epoch number", range=COUNT)
    # Choosing on a validation set (docs/recipes.md): the recipes' step between training and the test set.
    choose_on_valid: bool = option(
        False, "choose the checkpoints to average and the length penalty on --valid-source/--valid-reference "
        "(beam-search sacreBLEU): every pair of a candidate set (the last N: --choose-last, and all; the N of lowest "
        "validation loss: --choose-best) and a lenpen (--choose-lenpens); the fixed rule, the last "
        "--num-update-checkpoints at --choose-lenpen, is one of the pairs"
    )
    valid_source: Optional[str] = option(None, "validation source text (raw, one sentence a line) for --choose-on-valid",
                                         path=True)
    valid_reference: Optional[str] = option(None, "its reference translations, line by line, for --choose-on-valid",
                                            path=True)
    choose_last: tuple[int, ...] = option((1, 3, 5, 8, 12), "candidates: the average of the last N update checkpoints "
                                          "for each N that exists (and of all of them)", range=COUNT1)
    choose_best: tuple[int, ...] = option((3, 5), "candidates: the average of the N update checkpoints of lowest "
                                          "validation loss, for each N", range=COUNT1)
    choose_lenpen: float = option(0.6, "the fixed rule's length penalty (the recipe's translate lenpen); it wins ties",
                                  range=Range(-10, 10))
    choose_lenpens: tuple[float, ...] = option((0.6, 1.0, 1.5, 2.0, 2.5), "the length penalties tried with every "
                                               "candidate set (one beam search a set: the lenpens rerank it)",
                                               range=Range(-10, 10))
    choose_beam_size: int = option(4, "beam size of the validation translations (the test translation's)",
                                   range=Range(1, 1000))
    choose_report: Optional[str] = option(None, "write the choice and every candidate's score here (JSON; "
                                          "default: beside --output, NAME.choice.json)", path=True)

    def __post_init__(self) -> None:
        check_ranges(self)
        # (--choose-on-valid without the files is refused when it runs: a config may enable it and
        # leave the files to the recipe's flags)
        if not self.choose_on_valid and (self.valid_source, self.valid_reference) != (None, None):
            raise ConfigError("--valid-source and --valid-reference are read only with --choose-on-valid")
        if self.choose_on_valid and self.choose_report is None:  # resolved here, so the output guard sees it
            output = Path(self.output)
            object.__setattr__(self, "choose_report", str(output.with_name(output.stem + ".choice.json")))


@dataclass(frozen=True)
class DecodingOptions:
    """How a search decodes: the options that every search function takes (``decode/search.py``)."""

    beam_size: int = option(4, "beam size (paper: 4); 1 is greedy", aliases=("beam",), range=Range(1, 1000))
    nbest: int = option(1, "hypotheses per sentence (text: Moses n-best lines 'ID ||| text ||| score')", range=Range(1, 1000))
    lenpen: float = option(0.6, "length penalty alpha (paper: 0.6)", range=Range(-10, 10))
    lenpen_style: Literal["gnmt", "length"] = option(
        "gnmt", "gnmt: ((5+|Y|)/6)^alpha, the paper's (from GNMT); length: |Y|^alpha as fairseq"
    )
    beam_rule: Literal["fairseq", "marian"] = option(
        "fairseq", "when a beam search ends a sentence: fairseq: k live hypotheses every step, done at k "
        "finished; marian: each finished hypothesis takes its place out of the beam, done when none is live, "
        "and at the length bound the live end as they are, eos unscored (Marian's and the Bergamot page's rule, "
        "for outputs equal to theirs: --max-len-a f --max-len-b f is Marian's --max-length-factor f)"
    )
    max_len_a: float = option(1.0, "maximum output length a*|X|+b subwords (paper: |X|+50)", range=Range(0, 1000))
    max_len_b: int = option(50, "maximum output length a*|X|+b subwords (paper: |X|+50)", range=Range(-(1 << 20), 1 << 20))
    sampling: bool = option(False, "sample instead of beam search (--nbest samples per sentence)")
    temperature: float = option(1.0, "sampling temperature", range=Range(0, 1000, lo_open=True))
    top_k: int = option(0, "sample from the k most likely tokens (0: all)", aliases=("topk",), range=COUNT)
    top_p: float = option(1.0, "nucleus sampling probability mass", aliases=("topp",), range=Range(0, 1, lo_open=True))
    seed: int = option(1, "sampling seed: the same samples again for the same --seed with the same --batch-size, "
                       "--max-tokens and --buffer-size (they decide which sentences share a random stream)", range=COUNT)
    # What one sentence's lexical constraints may ask: the search's time and memory grow with them
    # (docs/decoding.md gives the bound); more is a one-line error (xf translate) or a 413 (xf serve).
    max_constraints: int = option(16, "lexical constraints of one sentence at most, its glossary terms included",
                                  range=COUNT1)
    max_constraint_forms: int = option(8, "alternative forms of one constraint or glossary entry at most", range=COUNT1)
    max_constraint_subwords: int = option(
        256, "subwords of all the forms of one sentence's constraints together at most", range=COUNT1)

    def __post_init__(self) -> None:
        check_ranges(self)
        if not self.sampling and self.nbest > self.beam_size:
            raise ValueError(f"--nbest {self.nbest} is larger than --beam-size {self.beam_size}")


@dataclass(frozen=True, kw_only=True)
class TranslateOptions(DecodingOptions):
    """xf translate: the decoding options plus what to read, write and run on."""

    path: tuple[str, ...] = option(
        help="checkpoint(s); several form an ensemble (probabilities averaged). --engine ctranslate2: "
        "the directory written by xf export ctranslate2"
    )
    engine: Literal["xf", "ctranslate2"] = option(
        "xf", "xf's own search, or CTranslate2 on an exported model (pip install 'xformer-cli[ctranslate2]')"
    )
    input: Optional[str] = option(None, "read this file instead of stdin (-: stdin)")
    output: Optional[str] = option(None, "write this file instead of stdout (atomically; -: stdout; a FIFO or "
                                   "device is written in place)")
    batch_size: int = option(64, "sentences per batch", range=Range(1, 1 << 20))
    max_tokens: int = option(0, "padded source subwords per batch instead of --batch-size (0: use batch_size)", range=COUNT)
    buffer_size: int = option(2000, "lines read ahead and sorted by length into batches", range=Range(1, 1 << 24))
    output_format: Literal["text", "jsonl"] = option(
        "text", "text lines, or JSON lines with source, hypotheses, scores, positional scores and confidence"
    )
    input_format: Literal["text", "jsonl"] = option(
        "text", "text lines, or JSON lines {\"source\": ..., \"prefix\": ..., \"constraints\": [...]}: each "
        "translation starts with its target prefix (forced, cut by the model's sentencepiece; empty or absent: none), "
        "the rest searched; constraints: phrases it must contain (a string, or a list of alternative forms)"
    )
    glossary: Optional[str] = option(
        None, "a UTF-8 TSV glossary (source term, a tab, the target term or its forms separated by |): the target "
        "terms of the source terms found in a line (whole words, case-insensitive, longest first) become its "
        "lexical constraints (xf engine, beam search)"
    )
    alternatives: int = option(
        0, "N: the N most likely subwords at the first position after the target prefix, each completed by the "
        "search (CTranslate2's return_alternatives), written as an N-best list in that order (0: off; --nbest 1)",
        range=Range(0, 1000),
    )
    device: Literal["auto", "cpu", "cuda"] = option("auto", "device")
    precision: Literal["auto", "fp32", "bf16", "fp16"] = option(
        "fp32", "inference precision, for either engine from what it computes in on the device; auto: bf16 where "
        "it has bf16 (the xf engine on bf16 GPUs and CPUs with bf16 instructions; CTranslate2 on bf16 GPUs only), else fp32 "
        "(outputs may change); fp16: CUDA only"
    )
    quantize: Literal["none", "int8"] = option(
        "none", "int8: dynamic int8 linear layers on CPU (faster; outputs may change)"
    )
    int8_engine: Literal["auto", "fbgemm", "x86", "onednn"] = option(
        "auto", "--quantize int8's matrix library, the model's own (two models in one process may differ): auto "
        "(by the CPU's flags, the decoding plan's rule: fbgemm on CPUs with AMX and on AMD CPUs with AVX-512 VNNI, x86 "
        "elsewhere), x86 (torch's pick of fbgemm or oneDNN by shape), fbgemm (its AVX2, AVX-512 and VNNI kernels) or "
        "onednn (whose int8 kernels use AMX tiles on CPUs with amx_int8); the weights are the same int8, the "
        "activations' quantization differs, so outputs may change; with --compile: the encoder's, and on CPUs "
        "without VNNI or AMX the decoder's too (its packed kernels called from the compiled step; with them the "
        "decoder's int8 products are compiled in its graph)"
    )
    threads: int = option(0, "CPU threads for torch (0: torch's default)", range=THREADS)
    workers: int = option(
        1, "batches decoded at once (CPU throughput: as CTranslate2's inter_threads and Marian's --cpu-threads): "
        "on the CPU each by its own process (its own copy of the models, no shared interpreter lock) with "
        "threads/workers torch threads, elsewhere by threads; 0: auto, the decoding plan's rule (on the CPU one "
        "process per core, one thread each); outputs are those of --workers 1",
        range=Range(0, 256),
    )
    compile: bool = option(
        False, "compile the decoder step with its output projection, log-softmax and specials mask ahead of time "
        "(torch.export and AOTInductor; dynamic shapes): built once into a package kept in $XDG_CACHE_HOME/xf/aot, "
        "keyed by the model, the code, torch and the CPU, which later runs load in about a second; the build time is "
        "reported apart from the speed; outputs may differ in the last float bits, with --quantize int8 within "
        "int8's tolerance (with VNNI or AMX its int8 products compiled in the graph, elsewhere the int8 engine's "
        "packed kernels called from it); xf engine on the CPU"
    )
    quiet: bool = option(False, "no progress bar or summary table on stderr (warnings are still shown)")
    confidence: Optional[str] = option(
        None, "a calibration file written by xf calibrate: how --output-format jsonl's \"confidence\" of each "
        "hypothesis combines its parts (default: exp of its mean log-probability per subword, 0 when a flag fires)",
        path=True,
    )
    reverse_path: tuple[str, ...] = option(
        (), "checkpoint(s) of a target->source model: the confidence also weighs the source's log-probability given "
        "the output (forced decoding, as xf score-pairs --reverse-path)"
    )
    target_lang: Optional[str] = option(
        None, "the language to translate into (ISO 639-1 or 639-3, e.g. de or deu): required for a multilingual model (its target "
        "tag starts every source), for a bilingual one only its own target is accepted; a jsonl input line's "
        "\"target_lang\" overrides it; with --output-format jsonl it also turns on the confidence's wrong_language "
        "flag, an output that py3langid finds unlikely in it (the detect extra)")
    formality: Optional[Literal["formal", "informal"]] = option(
        None, "the address to translate with, formal (Sie) or informal (du): every source starts with the model's "
        ">>formal<< or >>informal<< tag (a model trained on data of xf preprocess --formality-tags; others refuse "
        "it; unset: no tag, the training data's own mix); a jsonl input line's \"formality\" overrides it; not "
        "with --print-alignment")
    print_alignment: bool = option(
        False, "add each output's hard alignment, 'SRC-TGT' index pairs: text 'translation ||| 0-0 1-2', "
        "n-best 'ID ||| translation ||| score ||| 0-0 1-2', jsonl \"alignment\": [[0, 0], [1, 2]]"
    )
    alignment_layer: Optional[int] = option(
        None, "decoder layer whose cross-attention (head average) aligns, from 1; negative: from the end "
        "(default: the penultimate, as fairseq)", range=Range(-1000, 1000)
    )
    alignment_level: Literal["subword", "word"] = option(
        "subword", "align subwords, or whitespace-separated words (the pairs of their subwords' links)"
    )
    shortlist: Optional[str] = option(
        None, "a vocabulary shortlist written by xf shortlist: each batch's output projection and softmax run over "
        "its candidates only (faster; outputs may change); --engine ctranslate2: as its vocabulary map (use_vmap)"
    )
    split_sentences: Optional[str] = option(
        None, "LANG: split each line into sentences by the rules of source language LANG (ISO 639-1, e.g. en; "
        "sentencex), translate them as lines and join them again with the line's own spacing; a sentence over the "
        "model's positions is split at a clause or word boundary instead of truncated (text output, --nbest 1)"
    )

    def __post_init__(self) -> None:
        super().__post_init__()  # check_ranges(self) included
        # how the options run together on a machine (engine, precision, int8, --compile, --workers,
        # steering) is decided by decoding_plan.plan_decoding; these are the rules of the text alone
        if self.split_sentences is not None and (self.output_format != "text" or self.nbest > 1 or self.print_alignment):
            raise ValueError("--split-sentences writes one line of joined sentences per input line: it takes text "
                             "output with --nbest 1 and no --print-alignment")
        if self.split_sentences is not None and not self.split_sentences.isalpha():
            raise ValueError(f"--split-sentences {self.split_sentences!r}: expected a language code, e.g. en")
        if self.alternatives and self.nbest > 1:
            raise ValueError(f"--alternatives {self.alternatives} gives one completion per alternative: use --nbest 1")
        if self.split_sentences is not None and (self.input_format != "text" or self.alternatives):
            raise ValueError("--split-sentences translates the sentences of text lines: it takes --input-format text "
                             "and no --alternatives (a prefix belongs to one sentence)")
        if (self.confidence or self.reverse_path) and self.output_format != "jsonl":
            raise ValueError("--confidence and --reverse-path shape the \"confidence\" of --output-format jsonl: "
                             "use it")
        if self.glossary is not None and self.split_sentences:
            raise ValueError("--glossary matches terms in whole lines: it takes no --split-sentences")
        if self.formality is not None and self.print_alignment:
            raise ValueError("--formality puts a tag before each source, which --print-alignment does not "
                             "count yet: use it without it")
        # floor(a*|X| + b) output subwords for a source of |X| >= 1 subwords: at least 1 for every |X|
        if self.max_len_a + self.max_len_b < 1:
            raise ValueError(f"--max-len-a {self.max_len_a:g} --max-len-b {self.max_len_b} allow no output for "
                             "some sentences: the limit a*|X|+b must be at least 1 for every source length |X| >= 1 "
                             "(a >= 0 and a + b >= 1)")


def with_translate_fields(*names: str):
    """The options dataclass it decorates, with the fields ``names`` of TranslateOptions added
    after its own: the engine options are declared once, in TranslateOptions, and reach every
    command that opens an engine from there (help text, default and checks included)."""
    def decorate(cls: type) -> type:
        hints = typing.get_type_hints(TranslateOptions)
        source = {f.name: f for f in dataclasses.fields(TranslateOptions)}
        fields = [(name, hints[name], dataclasses.field(default=source[name].default, metadata=source[name].metadata))
                  for name in names]
        return dataclasses.make_dataclass(cls.__name__, fields, bases=(cls,), frozen=True, kw_only=True,
                                          namespace={"__module__": cls.__module__, "__doc__": cls.__doc__})
    return decorate


@with_translate_fields("engine", "device", "precision", "quantize", "int8_engine", "threads")
@dataclass(frozen=True, kw_only=True)
class ServeOptions(DecodingOptions):
    """xf serve: the decoding options (each request is decoded with them; a request may ask for
    fewer alternatives), the engine's (from TranslateOptions) and the server's own."""

    model: tuple[str, ...] = option(
        help="DIRECTIONS=CHECKPOINT, e.g. en-de=avg.pt, or en-de,en-fr=multi.pt for directions of one multilingual "
        "model (one copy in memory serves them all), or CHECKPOINT alone for every direction its meta records; "
        "repeat for more models (--engine ctranslate2: the directory written by xf export ctranslate2)"
    )
    host: str = option("127.0.0.1", "address to listen on (0.0.0.0: every interface)")
    port: int = option(5000, "port to listen on (0: any free port, printed at start)", range=Range(0, 65535))
    max_batch_tokens: int = option(2048, "source subwords decoded together at most (one dynamic batch)", range=COUNT1)
    max_wait_ms: float = option(5.0, "how long a batch's first request waits for others to join it",
                                range=Range(0, 60_000))
    max_queue_lines: int = option(2000, "lines waiting to be decoded at most; a request beyond is a 503", range=COUNT1)
    max_lines: int = option(100, "lines in one request at most (more: 413)", range=COUNT1)
    max_chars: int = option(5000, "characters in one request at most (more: 413)", range=COUNT1)
    max_body_bytes: int = option(1_000_000, "bytes in one request body at most, checked before parsing (more: 413)",
                                 range=COUNT1)
    timeout: float = option(30.0, "seconds a request may wait for its translation (longer: 504)",
                            range=Range(0, 86_400, lo_open=True))
    api_keys: Optional[str] = option(None, "a file of API keys, one a line; then /translate needs 'api_key' (else 403)")
    grace_seconds: float = option(10.0, "after SIGTERM: seconds to finish the requests in flight before exiting",
                                  range=Range(0, 86_400))
    split_sentences: bool = option(
        True, "split each text into sentences (sentencex, by the source language), translate them as lines and join "
        "them with the text's own spacing and line breaks; off: each line is one sentence, and a line over the "
        "model's positions is truncated (counted in the answer's 'truncated')"
    )
    glossary: tuple[str, ...] = option(
        (), "DIRECTION=FILE, e.g. en-de=terms.tsv: a glossary for that --model's direction (xf translate --glossary's "
        "TSV): the target terms of the source terms found in each sentence become its lexical constraints; repeat "
        "for more directions (xf engine)"
    )
    max_glossary_terms: int = option(500, "entries of a request's own 'glossary' at most (more: 413)", range=COUNT1)
    confidence: tuple[str, ...] = option(
        (), "DIRECTION=FILE, e.g. en-de=calibration.json: how that direction's answers' \"confidence\" combines its "
        "parts (written by xf calibrate without --reverse-path; default: exp of the mean log-probability per subword, "
        "0 when the output is a copy or not in the target language); repeat for more directions"
    )

    def __post_init__(self) -> None:
        super().__post_init__()  # check_ranges(self) included
        if self.sampling:
            raise ValueError("xf serve does not sample: a sample would depend on the requests that share its batch")
        specs = [model_spec(spec) for spec in self.model]
        directions = [direction for listed, _ in specs for direction in listed or []]
        for direction in directions:
            if directions.count(direction) > 1:
                raise ValueError(f"--model: direction {'-'.join(direction)} is given more than once")
        glossaries = [direction_and_path(spec, "--glossary", "FILE", "en-de=terms.tsv")[:2] for spec in self.glossary]
        for direction in glossaries:
            if glossaries.count(direction) > 1:
                raise ValueError(f"--glossary: direction {'-'.join(direction)} is given more than once (one glossary "
                                 "a direction)")
        for spec in self.confidence:
            direction_and_path(spec, "--confidence", "FILE", "en-de=calibration.json")
        if all(listed for listed, _ in specs):  # else the directions are known once the models' meta is read
            check_served(self, directions)
        self.translate_options("check")  # TranslateOptions' own checks (the length limit)

    def translate_options(self, path: str) -> "TranslateOptions":
        """The options of ``xf translate --path PATH`` with this server's decoding and engine options."""
        shared = {f.name for f in dataclasses.fields(TranslateOptions)} & {f.name for f in dataclasses.fields(self)}
        # split_sentences: the server's switch (a bool), not xf translate's language (each direction has its own);
        # glossary and confidence: the server's, per direction (DIRECTION=FILE), applied by xf serve itself;
        # output_format jsonl: every answer has a confidence, which needs each subword's log-probability
        # (CTranslate2 computes them for jsonl output only; without them its confidence was exp(0) = 1)
        return TranslateOptions(path=(path,), output_format="jsonl",
                                **{name: getattr(self, name) for name in shared
                                   if name not in ("path", "split_sentences", "glossary", "confidence", "output_format")})


def model_spec(spec: str) -> tuple[Optional[list[tuple[str, str]]], str]:
    """``en-de,en-fr=multi.pt`` -> ([("en", "de"), ("en", "fr")], "multi.pt"); ``multi.pt`` (no
    "=") -> (None, "multi.pt"): the directions its meta records. A ValueError naming the value
    otherwise (each direction as ``direction_and_path`` takes it, none twice)."""
    if "=" not in spec:
        if not spec:
            raise ValueError("--model '': expected SOURCE-TARGET=CHECKPOINT, e.g. en-de=avg.pt, or a checkpoint")
        return None, spec
    listed, _, path = spec.partition("=")
    directions = [direction_and_path(f"{item.strip()}={path}", "--model")[:2] for item in listed.split(",")]
    for direction in directions:
        if directions.count(direction) > 1:
            raise ValueError(f"--model {spec!r}: direction {'-'.join(direction)} is given twice")
    return directions, path


def check_served(options: "ServeOptions", directions: list[tuple[str, str]]) -> None:
    """Refuse a --glossary or --confidence for a direction no --model serves (a ValueError)."""
    for flag, specs in (("--glossary", options.glossary), ("--confidence", options.confidence)):
        for spec in specs:
            direction = direction_and_path(spec, flag, "FILE")[:2]
            if direction not in directions:
                raise ValueError(f"{flag} {'-'.join(direction)}=...: no --model serves {'-'.join(direction)}")


def direction_and_path(spec: str, flag: str = "--model", what: str = "CHECKPOINT",
                       example: str = "en-de=avg.pt") -> tuple[str, str, str]:
    """``en-de=avg.pt`` -> ("en", "de", "avg.pt"); a ValueError naming the ``flag`` value otherwise."""
    direction, sep, path = spec.partition("=")
    source, dash, target = direction.partition("-")
    if not sep or not dash or not path or not source or not target or "-" in target:
        raise ValueError(f"{flag} {spec!r}: expected SOURCE-TARGET={what}, e.g. {example}")
    if source == target:  # well formed, but no direction: say so, not "expected SOURCE-TARGET"
        raise ValueError(f"{flag} {spec!r}: the source and the target are both '{source}': a direction translates "
                         "between two languages")
    return source, target, path


@dataclass(frozen=True)
class ShortlistOptions:
    data: str = option(help="data directory written by xf preprocess (its train split is read)", positional=True,
                       path=True)
    output: str = option(help="the shortlist file to write (.npz), for xf translate --shortlist")
    frequent: int = option(100, "the most frequent target pieces, always candidates", range=Range(0, 1 << 24))
    per_source: int = option(20, "target pieces per source piece, by IBM Model 1's p(target | source)",
                             range=Range(1, 100_000))
    em_iterations: int = option(5, "EM iterations of IBM Model 1", range=Range(1, 1000))
    overwrite: bool = option(False, "replace --output if it exists")

    def __post_init__(self) -> None:
        check_ranges(self)


@dataclass(frozen=True)
class ExportOptions:
    format: Literal["ctranslate2", "huggingface", "argos", "marian", "bergamot"] = option(
        help="what to export to: ctranslate2, huggingface (a MarianMT directory), argos (an Argos Translate "
             "package file, .argosmodel, for argostranslate and LibreTranslate), marian (model.npz for Marian, "
             "Bergamot, translateLocally) or bergamot (a page that translates in the browser)", positional=True)
    path: str = option(help="the xf checkpoint to export")
    output: str = option(help="the model directory to write (ctranslate2: with the sentencepiece model as spm.model; "
                              "argos: the package file)")
    quantization: Literal["auto", "float32", "int8", "bfloat16"] = option(
        "auto", "weight type of the exported model: ctranslate2 and argos: float32 (auto), int8 or bfloat16 "
        "(CTranslate2 can still compute in another type); bergamot: int8 (marian-conv's intgemm8, multiplied "
        "int8shiftAll; auto, where the model's widths allow it, else float32: smaller and faster in the page) or float32"
    )
    beam_size: int = option(4, "huggingface: num_beams of generation_config.json; marian: beam-size of decoder.yml; "
                            "bergamot: the page's beam size", aliases=("beam",), range=Range(1, 1000))
    lenpen: float = option(1.0, "huggingface: length_penalty of generation_config.json, score / |Y|^lenpen "
                           "(xf translate --lenpen-style length; GNMT's penalty has no transformers equivalent); "
                           "marian and bergamot: normalize",
                           range=Range(-10, 10))
    max_length: int = option(0, "huggingface: max_length of generation_config.json, decoder start and eos "
                             "included (0: 512, as OPUS-MT models have, or max_positions if fewer)",
                             range=Range(0, 1 << 20))
    source_lang: Optional[str] = option(
        None, "huggingface: source language, for the model card and tokenizer; argos: the package's from_code; "
        "bergamot: its two letters name the direction (default: the model's recorded language, else en; one "
        "that contradicts the model's is refused)")
    target_lang: Optional[str] = option(
        None, "huggingface: target language, for the model card and tokenizer; argos: the package's to_code; "
        "bergamot: as --source-lang (default: the model's recorded language, else de)")
    source_name: Optional[str] = option(None, "argos: the source language's name LibreTranslate shows (default: "
                                        "--source-lang)")
    target_name: Optional[str] = option(None, "argos: the target language's name (default: --target-lang)")
    package_version: str = option("1.0", "argos: the package's version (metadata.json's package_version, "
                                  "and its directory's name: translate-en_de-1_0)")
    bleu: Optional[str] = option(None, "huggingface: the test score for the model card: a file written by "
                                 "xf score --json (BLEU and its sacreBLEU signature)")
    shortlist: Optional[str] = option(None, "bergamot: the vocabulary shortlist written by xf shortlist for "
                                      "this model, written as Bergamot's binary shortlist")
    bergamot_package: str = option(".bergamot/node_modules/@browsermt/bergamot-translator",
                                   "bergamot: the npm package @browsermt/bergamot-translator 0.4.9 whose engine "
                                   "the page runs (make bergamot installs it there)")
    overwrite: bool = option(False, "replace an existing non-empty output directory (argos: an existing file)")

    def __post_init__(self) -> None:
        check_ranges(self)  # an option the format does not read is refused by xf export (commands/export.USED_BY)
        for flag, name in (("--source-name", self.source_name), ("--target-name", self.target_name)):
            if name is not None and (not name.strip() or not name.isprintable()):  # a newline went into metadata.json
                raise ConfigError(f"{flag} {name!r}: a language's name is one line of printable text")


@dataclass(frozen=True)
class ImportOptions:
    format: Literal["huggingface"] = option(help="what to import from: huggingface (a MarianMT directory)",
                                            positional=True)
    directory: str = option(help="the model directory (e.g. from huggingface-cli download Helsinki-NLP/opus-mt-en-de)",
                            positional=True)
    output: str = option(help="the xf checkpoint to write")
    overwrite: bool = option(False, "replace --output if it exists")


@dataclass(frozen=True)
class ScoreOptions:
    ref: tuple[str, ...] = option(help="reference file(s); repeat --ref for several references")
    hyp: Optional[str] = option(None, "hypothesis file (default: stdin)")
    metrics: str = option("bleu,chrf,ter", "comma-separated: bleu (detokenized sacreBLEU), chrf, ter")
    lowercase: bool = option(False, "case-insensitive BLEU and chrF (sacreBLEU's TER is always case-insensitive)")
    tokenized_bleu: bool = option(
        False,
        "also the paper's BLEU: Moses-tokenized (sacremoses), compound-split (a-b -> a ##AT##-##AT## b). "
        "The paper's 27.3/28.4 (EN-DE base/big) were measured this way; detokenized sacreBLEU is "
        "about 1 to 1.5 points lower",
    )
    target_lang: Optional[str] = option(
        None, "language of the text for the Moses tokenizer of --tokenized-bleu (default: the first --ref's suffix, else en)"
    )
    paired_bs: tuple[str, ...] = option(
        (), "other systems' hypotheses: paired bootstrap resampling (sacrebleu, 1000 samples) against --hyp"
    )
    json: bool = option(False, "print JSON instead of text")


@with_translate_fields("batch_size", "buffer_size", "device", "precision", "threads", "quiet", "target_lang")
@dataclass(frozen=True, kw_only=True)
class ScorePairsOptions:
    """xf score-pairs: what to score and with which models, how to write it, and the engine's
    options (from TranslateOptions)."""

    path: tuple[str, ...] = option(
        help="checkpoint(s) of the source->target model; several form an ensemble (probabilities averaged, as "
        "xf translate's)"
    )
    source: str = option(help="source sentences, one a line (raw text)")
    target: str = option(help="target sentences, one a line: line N is the translation of --source's line N")
    reverse_path: tuple[str, ...] = option(
        (), "checkpoint(s) of a target->source model: also score each pair in reverse and give the dual conditional "
        "cross-entropy |H_fwd - H_rev| + (H_fwd + H_rev)/2 (Junczys-Dowmunt, 2018; lower is better)"
    )
    output: Optional[str] = option(None, "write this file instead of stdout (atomically; -: stdout; a FIFO or "
                                   "device is written in place)")
    output_format: Literal["jsonl", "text"] = option(
        "jsonl", "JSON lines {\"line\", \"score\" (summed log-probability), \"tokens\" (target subwords + eos), \"mean\"} "
        "(with --reverse-path also the reverse's and the cross-entropies and dual score), or one number a line"
    )
    normalize: Literal["mean", "sum"] = option(
        "mean", "the number of --output-format text: the log-probability per target subword (eos included) or "
        "summed; with --reverse-path text shows the dual score"
    )
    max_tokens: int = option(0, "padded subwords per batch on either side instead of --batch-size (0: use batch_size)",
                             range=COUNT)

    def __post_init__(self) -> None:
        check_ranges(self)
        if self.reverse_path and self.output_format == "text" and self.normalize == "sum":
            raise ConfigError("--reverse-path writes the dual score, which is per token: --normalize sum has no "
                              "dual score (use --output-format jsonl for the sums)")


@with_translate_fields("beam_size", "lenpen", "lenpen_style", "max_len_a", "max_len_b", "batch_size", "max_tokens",
                       "device", "precision", "threads", "reverse_path", "target_lang")
@dataclass(frozen=True, kw_only=True)
class CalibrateOptions:
    """xf calibrate: the validation set, the models, and the decoding options of the translations
    it fits on (from TranslateOptions: use those xf translate will run with)."""

    path: tuple[str, ...] = option(help="checkpoint(s) of the source->target model (several: an ensemble)")
    source: str = option(help="validation source sentences, one a line (raw text; never the test set)")
    reference: str = option(help="their reference translations, line by line: the fit's label is a sentence's "
                            "chrF at least the median")
    output: str = option(help="the calibration file to write (JSON), for xf translate --confidence")
    overwrite: bool = option(False, "replace --output if it exists")

    def __post_init__(self) -> None:
        check_ranges(self)


@dataclass(frozen=True)
class PlotCurvesOptions:
    save_dirs: tuple[str, ...] = option(
        help="save directories of xf train (or their train_log.jsonl files); several are overlaid", positional=True
    )
    output: str = option("curves.png", "the picture to write (.png, .pdf or .svg)", short="-o")
    wall_time: bool = option(False, "x axis: minutes of training wall time (validation included) instead of updates")


@dataclass(frozen=True)
class PlotAttentionOptions:
    path: str = option(help="checkpoint")
    source: str = option(help="the source sentence")
    target: Optional[str] = option(None, "force-decode this translation (default: the model's own, beam search)")
    output: str = option("attention.png", "the picture to write (.png, .pdf or .svg)", short="-o")
    attention: Literal["cross", "encoder", "decoder"] = option(
        "cross", "encoder-decoder attention, encoder self-attention or decoder self-attention"
    )
    layer: Optional[int] = option(None, "only this layer, from 1; negative: from the end (default: all layers)", range=Range(-1000, 1000))
    head: Optional[int] = option(None, "only this head, from 1 (default: all heads)", range=Range(1, 1024))
    style: Literal["heatmap", "lines"] = option(
        "heatmap", "heat maps (layers x heads), or lines between the tokens as in the paper's Figures 3-5 "
        "(one layer: --layer; heads in colours)"
    )
    beam_size: int = option(4, "beam size for the model's own translation", aliases=("beam",), range=Range(1, 1000))
    device: Literal["auto", "cpu", "cuda"] = option("auto", "device")

    def __post_init__(self) -> None:
        check_ranges(self)
