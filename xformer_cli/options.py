"""The options of every subcommand and of the model, as frozen dataclasses (config as data).

Each field is a YAML key and a CLI flag of the same name (``max_tokens`` / ``--max-tokens``);
the help text is shown by ``xf CMD --help``. Impossible values are rejected in ``__post_init__``
(a ConfigError, one line). This module imports neither torch nor the CLI, so ``xf --help`` and
``xf score`` start fast; that is why the model's configuration lives here and not in model.py.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from typing import Literal, Optional

from .config import build_options, option
from .errors import ConfigError


def at_least(o, minimum: int, *names: str) -> None:
    """ConfigError unless every option of ``names`` is at least ``minimum``."""
    for name in names:
        if getattr(o, name) < minimum:
            what = "must not be negative" if minimum == 0 else f"must be at least {minimum}"
            raise ConfigError(f"--{name.replace('_', '-')} {what}, got {getattr(o, name)}")


def probability(o, *names: str) -> None:
    """ConfigError unless every option of ``names`` (None: unset) is in [0, 1)."""
    for name in names:
        value = getattr(o, name)
        if value is not None and not 0 <= value < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be in [0, 1), got {value}")


# -- the model ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int = option(37000, "joint source+target vocabulary size")
    encoder_layers: int = option(6, "N encoder layers")
    decoder_layers: int = option(6, "N decoder layers")
    d_model: int = option(512, "model width")
    d_ff: int = option(2048, "inner width of the position-wise feed-forward network")
    heads: int = option(8, "attention heads h")
    head_dim: Optional[int] = option(
        None, "d_k = d_v, the size of each head (default: d_model / heads); Table 3 row B shrinks it"
    )
    dropout: float = option(0.1, "P_drop on embeddings+positions and every sub-layer output")
    attention_dropout: float = option(0.0, "dropout on attention weights (not in the paper)")
    activation_dropout: float = option(0.0, "dropout after the FFN activation (not in the paper)")
    normalize_before: bool = option(False, "pre-LN instead of the paper's post-LN")
    activation: Literal["relu", "gelu", "swiglu"] = option("relu", "FFN activation")
    positions: Literal["sinusoidal", "learned", "rope", "alibi"] = option(
        "sinusoidal", "position information"
    )
    max_positions: int = option(1024, "longest sequence the model accepts")
    share_embeddings: Literal["all", "decoder", "none"] = option(
        "all", "tie source, target and output embeddings (all), target and output (decoder)"
    )

    def __post_init__(self) -> None:
        at_least(self, 1, "vocab_size", "encoder_layers", "decoder_layers", "d_model", "d_ff", "heads",
                 "max_positions")
        probability(self, "dropout", "attention_dropout", "activation_dropout")
        if self.head_dim is None:
            if self.d_model % self.heads:
                raise ConfigError(f"d_model {self.d_model} is not divisible by heads {self.heads} (or set --head-dim)")
            # the resolved size is what checkpoints record; one written before head_dim existed
            # has no such key and gets d_model / heads here, the size it was trained with
            object.__setattr__(self, "head_dim", self.d_model // self.heads)
        at_least(self, 1, "head_dim")
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
                        option(None, f"{model_fields[name].metadata['help']} (default: the --arch preset's)"))
                       for name in MODEL_OVERRIDES]
    # the class's own methods, not those that @dataclass generated
    namespace = {k: v for k, v in vars(cls).items() if callable(v) and (not k.startswith("__") or k == "__post_init__")}
    namespace["__module__"] = cls.__module__
    return dataclasses.make_dataclass(cls.__name__, fields, frozen=True, namespace=namespace)


# -- the commands ------------------------------------------------------------------------------
@dataclass(frozen=True)
class PreprocessOptions:
    destdir: str = option(help="output directory (data-bin/NAME); refused if it exists and is not empty")
    source_lang: str = option("en", "source language suffix of the raw files")
    target_lang: str = option("de", "target language suffix of the raw files")
    trainpref: Optional[str] = option(None, "training files prefix (PREFIX.src, PREFIX.tgt)")
    validpref: Optional[str] = option(None, "validation files prefix (comma-separated: valid, valid1, ...)")
    testpref: Optional[str] = option(None, "test files prefix (comma-separated: test, test1, ...)")
    bpe_vocab_size: int = option(37000, "joint sentencepiece BPE vocabulary size (paper EN-DE: 37000)")
    bpe_sample_lines: int = option(
        2_000_000, "training pairs sampled (both sides) to learn the BPE model; bounds its memory"
    )
    spm_model: Optional[str] = option(None, "reuse this sentencepiece model instead of learning one")
    max_len: int = option(250, "drop training pairs longer than this many subwords on either side")
    max_len_ratio: float = option(1.5, "drop training pairs whose subword length ratio exceeds this")
    workers: int = option(1, "parallel encoding processes (also sentencepiece training threads)")
    skip_invalid: bool = option(
        False, "invalid UTF-8: drop (train) or replace with U+FFFD (valid/test) and count, instead of failing"
    )
    overwrite: bool = option(False, "replace an existing non-empty destdir")
    seed: int = option(1, "seed for BPE sampling")
    verify: bool = option(False, "instead of writing destdir, check it: every file against the sha256 in its "
                          "meta.json, every index against its .bin and the vocabulary")

    def __post_init__(self) -> None:
        if self.source_lang == self.target_lang:
            raise ConfigError(f"--source-lang and --target-lang are both {self.source_lang!r}")
        at_least(self, 1, "workers", "max_len", "bpe_sample_lines")
        at_least(self, 8, "bpe_vocab_size")
        if self.max_len_ratio < 1:
            raise ConfigError(f"--max-len-ratio must be at least 1.0, got {self.max_len_ratio}")


@with_model_overrides
@dataclass(frozen=True)
class TrainOptions:
    data: str = option(help="data directory written by xf preprocess", positional=True)
    save_dir: str = option("checkpoints", "where checkpoints and logs are written")
    arch: str = option("base", "architecture preset: base | big | small | tiny")
    # batching
    max_tokens: int = option(4096, "tokens per micro-batch (source or target, whichever is larger)")
    update_freq: int = option(1, "micro-batches accumulated per update")
    max_update: int = option(0, "stop after this many updates (0: no limit)")
    max_epoch: int = option(0, "stop after this many epochs (0: no limit)")
    stop_time_hours: float = option(0.0, "stop after this many hours of training wall time, resumes "
                                    "included (0: no limit)")
    # optimization
    optimizer: Literal["adam", "adamw"] = option(
        "adam", "adam: the paper's Adam; adamw: Adam with decoupled --weight-decay (fairseq's 'adam')"
    )
    adam_betas: tuple[float, ...] = option((0.9, 0.98), "Adam betas (paper: 0.9 0.98)")
    adam_eps: float = option(1e-9, "Adam epsilon (paper: 1e-9)")
    lr_scheduler: Literal["noam", "inverse_sqrt"] = option("noam", "learning-rate schedule")
    warmup_updates: int = option(4000, "warmup steps (paper: 4000)")
    lr: Optional[float] = option(None, "inverse_sqrt: the peak learning rate, reached after warmup")
    lr_factor: float = option(1.0, "noam: a factor on the paper's formula (paper: 1)")
    warmup_init_lr: float = option(1e-7, "inverse_sqrt: learning rate at step 0")
    label_smoothing: float = option(0.1, "label smoothing epsilon (paper: 0.1)")
    clip_norm: float = option(0.0, "clip gradient norm (0: off)")
    weight_decay: float = option(0.0, "decoupled weight decay (--optimizer adamw)")
    precision: Literal["auto", "fp32", "bf16", "fp16"] = option(
        "auto", "training precision; auto: bf16 autocast where the GPU or CPU multiplies bf16 natively "
        "(CUDA sm_80+, avx512_bf16 or AMX), else fp32; fp16 (loss-scaled) is for older GPUs")
    device: Literal["auto", "cpu", "cuda"] = option("auto", "device")
    threads: int = option(0, "CPU threads for torch (0: torch's default)")
    compile: bool = option(False, "torch.compile the model (inductor, dynamic shapes: compiled once for "
                           "all batch shapes); the compile time is reported apart from the speed")
    seed: int = option(1, "random seed")
    # checkpoints, validation, logging
    save_interval_updates: int = option(0, "also save checkpoint_<epoch>_<update>.pt every N updates")
    save_interval_minutes: float = option(10.0, "also refresh checkpoint_last.pt every N minutes (0: off)")
    keep_last_checkpoints: int = option(10, "keep this many update checkpoints (0: all)")
    validate_interval_updates: int = option(0, "validate every N updates (and at each epoch end)")
    patience: int = option(0, "stop after N validations without improvement (0: off)")
    eval_bleu: bool = option(False, "validation BLEU (greedy) as the best-checkpoint criterion")
    log_interval: int = option(50, "updates between log lines")
    tensorboard_logdir: Optional[str] = option(None, "write TensorBoard scalars here")
    max_nan_updates: int = option(20, "stop after this many consecutive non-finite updates")
    ddp_timeout_minutes: float = option(
        10.0, "torchrun: a process that waits this long for another (dead or hung) stops with an error"
    )

    def __post_init__(self) -> None:
        at_least(self, 1, "max_tokens", "update_freq", "log_interval", "max_nan_updates")
        at_least(self, 0, "max_update", "max_epoch", "save_interval_updates", "keep_last_checkpoints",
                 "validate_interval_updates", "patience", "clip_norm", "weight_decay", "threads",
                 "warmup_updates", "save_interval_minutes", "stop_time_hours")
        if self.ddp_timeout_minutes <= 0:
            raise ConfigError(f"--ddp-timeout-minutes must be positive, got {self.ddp_timeout_minutes}")
        probability(self, "label_smoothing")
        if len(self.adam_betas) != 2 or not all(0 <= b < 1 for b in self.adam_betas):
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
        if self.weight_decay and self.optimizer == "adam":
            raise ConfigError("--weight-decay is decoupled weight decay: use --optimizer adamw")
        model_config(self.arch, **{name: getattr(self, name) for name in MODEL_OVERRIDES})  # the model's checks


@dataclass(frozen=True)
class AverageOptions:
    inputs: tuple[str, ...] = option(help="checkpoint directory (or directories) or checkpoint files")
    output: str = option(help="averaged checkpoint to write")
    num_update_checkpoints: int = option(
        0, "average the last N checkpoint_<epoch>_<update>.pt by update number (paper: 5 base, 20 big)"
    )
    num_epoch_checkpoints: int = option(0, "average the last N epoch-end checkpoints by epoch number")
    overwrite: bool = option(False, "replace --output even when it is a training checkpoint (checkpoint_last.pt, "
                             "checkpoint_best.pt, checkpoint_<epoch>_<update>.pt); an input is never replaced")


@dataclass(frozen=True)
class DecodingOptions:
    """How a search decodes: the options that every search function takes (``search.py``)."""

    beam_size: int = option(4, "beam size (paper: 4); 1 is greedy", aliases=("beam",))
    nbest: int = option(1, "hypotheses per sentence (text: Moses n-best lines 'ID ||| text ||| score')")
    lenpen: float = option(0.6, "length penalty alpha (paper: 0.6)")
    lenpen_style: Literal["gnmt", "length"] = option(
        "gnmt", "gnmt: ((5+|Y|)/6)^alpha, the paper's (from GNMT); length: |Y|^alpha as fairseq"
    )
    max_len_a: float = option(1.0, "maximum output length a*|X|+b subwords (paper: |X|+50)")
    max_len_b: int = option(50, "maximum output length a*|X|+b subwords (paper: |X|+50)")
    sampling: bool = option(False, "sample instead of beam search (--nbest samples per sentence)")
    temperature: float = option(1.0, "sampling temperature")
    top_k: int = option(0, "sample from the k most likely tokens (0: all)", aliases=("topk",))
    top_p: float = option(1.0, "nucleus sampling probability mass", aliases=("topp",))
    seed: int = option(1, "sampling seed")

    def __post_init__(self) -> None:
        problems = []
        if self.beam_size < 1:
            problems.append("--beam-size must be at least 1")
        if self.nbest < 1:
            problems.append("--nbest must be at least 1")
        if not self.sampling and self.nbest > self.beam_size:
            problems.append(f"--nbest {self.nbest} is larger than --beam-size {self.beam_size}")
        if self.temperature <= 0 or not 0 < self.top_p <= 1 or self.top_k < 0:
            problems.append("sampling needs --temperature > 0, 0 < --top-p <= 1, --top-k >= 0")
        if problems:
            raise ValueError("; ".join(problems))


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
    input: Optional[str] = option(None, "read this file instead of stdin")
    output: Optional[str] = option(None, "write this file instead of stdout (atomically)")
    batch_size: int = option(64, "sentences per batch")
    max_tokens: int = option(0, "padded source subwords per batch instead of --batch-size (0: use batch_size)")
    buffer_size: int = option(2000, "lines read ahead and sorted by length into batches")
    output_format: Literal["text", "jsonl"] = option(
        "text", "text lines, or JSON lines with source, hypotheses, scores and positional scores"
    )
    device: Literal["auto", "cpu", "cuda"] = option("auto", "device")
    precision: Literal["auto", "fp32", "bf16", "fp16"] = option(
        "fp32", "inference precision; auto: bf16 on GPUs and on CPUs with bf16 instructions, else fp32 "
        "(outputs may change); fp16: CUDA only"
    )
    quantize: Literal["none", "int8"] = option(
        "none", "int8: dynamic int8 linear layers on CPU (faster; outputs may change)"
    )
    threads: int = option(0, "CPU threads for torch (0: torch's default)")
    quiet: bool = option(False, "no progress bar or summary table on stderr (warnings are still shown)")
    print_alignment: bool = option(
        False, "add each output's hard alignment, 'SRC-TGT' index pairs: text 'translation ||| 0-0 1-2', "
        "n-best 'ID ||| translation ||| score ||| 0-0 1-2', jsonl \"alignment\": [[0, 0], [1, 2]]"
    )
    alignment_layer: Optional[int] = option(
        None, "decoder layer whose cross-attention (head average) aligns, from 1; negative: from the end "
        "(default: the penultimate, as fairseq)"
    )
    alignment_level: Literal["subword", "word"] = option(
        "subword", "align subwords, or whitespace-separated words (the pairs of their subwords' links)"
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        # floor(a*|X| + b) output subwords for a source of |X| >= 1 subwords: at least 1 for every |X|
        if self.max_len_a < 0 or self.max_len_a + self.max_len_b < 1:
            raise ValueError(f"--max-len-a {self.max_len_a:g} --max-len-b {self.max_len_b} allow no output for "
                             "some sentences: the limit a*|X|+b must be at least 1 for every source length |X| >= 1 "
                             "(a >= 0 and a + b >= 1)")
        if self.batch_size < 1 or self.buffer_size < 1 or self.max_tokens < 0:
            raise ValueError("--batch-size and --buffer-size must be positive, --max-tokens non-negative")


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


@with_translate_fields("engine", "device", "precision", "quantize", "threads")
@dataclass(frozen=True, kw_only=True)
class ServeOptions(DecodingOptions):
    """xf serve: the decoding options (each request is decoded with them; a request may ask for
    fewer alternatives), the engine's (from TranslateOptions) and the server's own."""

    model: tuple[str, ...] = option(
        help="DIRECTION=CHECKPOINT, e.g. en-de=avg.pt; repeat for more directions (--engine ctranslate2: "
        "the directory written by xf export ctranslate2)"
    )
    host: str = option("127.0.0.1", "address to listen on (0.0.0.0: every interface)")
    port: int = option(5000, "port to listen on (0: any free port, printed at start)")
    max_batch_tokens: int = option(2048, "source subwords decoded together at most (one dynamic batch)")
    max_wait_ms: float = option(5.0, "how long a batch's first request waits for others to join it")
    max_queue_lines: int = option(2000, "lines waiting to be decoded at most; a request beyond is a 503")
    max_lines: int = option(100, "lines in one request at most (more: 413)")
    max_chars: int = option(5000, "characters in one request at most (more: 413)")
    max_body_bytes: int = option(1_000_000, "bytes in one request body at most, checked before parsing (more: 413)")
    timeout: float = option(30.0, "seconds a request may wait for its translation (longer: 504)")
    api_keys: Optional[str] = option(None, "a file of API keys, one a line; then /translate needs 'api_key' (else 403)")
    grace_seconds: float = option(10.0, "after SIGTERM: seconds to finish the requests in flight before exiting")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.sampling:
            raise ValueError("xf serve does not sample: a sample would depend on the requests that share its batch")
        at_least(self, 1, "max_batch_tokens", "max_queue_lines", "max_lines", "max_chars", "max_body_bytes")
        at_least(self, 0, "port")
        if self.port > 65535:
            raise ValueError(f"--port must be at most 65535, got {self.port}")
        if self.max_wait_ms < 0 or self.timeout <= 0 or self.grace_seconds < 0:
            raise ValueError("--max-wait-ms and --grace-seconds must not be negative, --timeout must be positive")
        directions = [direction_and_path(spec)[:2] for spec in self.model]
        for direction in directions:
            if directions.count(direction) > 1:
                raise ValueError(f"--model: direction {'-'.join(direction)} is given more than once")
        self.translate_options("check")  # TranslateOptions' own checks (the length limit)

    def translate_options(self, path: str) -> "TranslateOptions":
        """The options of ``xf translate --path PATH`` with this server's decoding and engine options."""
        shared = {f.name for f in dataclasses.fields(TranslateOptions)} & {f.name for f in dataclasses.fields(self)}
        return TranslateOptions(path=(path,), **{name: getattr(self, name) for name in shared if name != "path"})


def direction_and_path(spec: str) -> tuple[str, str, str]:
    """``en-de=avg.pt`` -> ("en", "de", "avg.pt"); a ValueError naming the --model value otherwise."""
    direction, sep, path = spec.partition("=")
    source, dash, target = direction.partition("-")
    if not sep or not dash or not path or not source or not target or "-" in target or source == target:
        raise ValueError(f"--model {spec!r}: expected SOURCE-TARGET=CHECKPOINT, e.g. en-de=avg.pt")
    return source, target, path


@dataclass(frozen=True)
class ExportOptions:
    format: Literal["ctranslate2"] = option(help="what to export to: ctranslate2", positional=True)
    path: str = option(help="the xf checkpoint to export")
    output: str = option(help="the model directory to write (with the sentencepiece model as spm.model)")
    quantization: Literal["float32", "int8", "bfloat16"] = option(
        "float32", "weight type of the exported model (CTranslate2 can still compute in another type)"
    )
    overwrite: bool = option(False, "replace an existing non-empty output directory")


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
    layer: Optional[int] = option(None, "only this layer, from 1; negative: from the end (default: all layers)")
    head: Optional[int] = option(None, "only this head, from 1 (default: all heads)")
    style: Literal["heatmap", "lines"] = option(
        "heatmap", "heat maps (layers x heads), or lines between the tokens as in the paper's Figures 3-5 "
        "(one layer: --layer; heads in colours)"
    )
    beam_size: int = option(4, "beam size for the model's own translation", aliases=("beam",))
    device: Literal["auto", "cpu", "cuda"] = option("auto", "device")
