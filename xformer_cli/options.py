"""The options of every subcommand, as frozen dataclasses (config as data).

Each field is a YAML key and a CLI flag of the same name (``max_tokens`` / ``--max-tokens``);
the help text is shown by ``xf CMD --help``. This module imports neither torch nor the CLI, so
``xf --help`` and ``xf score`` start fast.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional

from .config import option


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


@dataclass(frozen=True)
class TrainOptions:
    data: str = option(help="data directory written by xf preprocess", positional=True)
    save_dir: str = option("checkpoints", "where checkpoints and logs are written")
    arch: str = option("base", "architecture preset: base | big | small | tiny")
    # model overrides (None keeps the preset's value)
    dropout: Optional[float] = option(None, "override the preset's dropout")
    attention_dropout: Optional[float] = option(None, "dropout on attention weights")
    activation_dropout: Optional[float] = option(None, "dropout after the FFN activation")
    normalize_before: Optional[bool] = option(None, "pre-LN instead of post-LN")
    activation: Optional[Literal["relu", "gelu", "swiglu"]] = option(None, "FFN activation")
    positions: Optional[Literal["sinusoidal", "learned", "rope", "alibi"]] = option(None, "positions")
    share_embeddings: Optional[Literal["all", "decoder", "none"]] = option(None, "weight tying")
    encoder_layers: Optional[int] = option(None, "override the preset's encoder depth")
    decoder_layers: Optional[int] = option(None, "override the preset's decoder depth")
    d_model: Optional[int] = option(None, "override the preset's width")
    d_ff: Optional[int] = option(None, "override the preset's FFN width")
    heads: Optional[int] = option(None, "override the preset's head count")
    # batching
    max_tokens: int = option(4096, "tokens per micro-batch (source or target, whichever is larger)")
    update_freq: int = option(1, "micro-batches accumulated per update")
    max_update: int = option(0, "stop after this many updates (0: no limit)")
    max_epoch: int = option(0, "stop after this many epochs (0: no limit)")
    stop_time_hours: float = option(0.0, "stop after this many hours of training wall time, resumes "
                                    "included (0: no limit)")
    # optimization
    optimizer: Literal["adam"] = option("adam", "Adam (beta1 0.9, beta2 0.98, eps 1e-9)")
    adam_betas: tuple[float, ...] = option((0.9, 0.98), "Adam betas (paper: 0.9 0.98)")
    adam_eps: float = option(1e-9, "Adam epsilon (paper: 1e-9)")
    lr_scheduler: Literal["noam", "inverse_sqrt"] = option("noam", "learning-rate schedule")
    warmup_updates: int = option(4000, "warmup steps (paper: 4000)")
    lr: Optional[float] = option(None, "peak learning rate (inverse_sqrt); noam: a factor on the formula")
    warmup_init_lr: float = option(1e-7, "inverse_sqrt: learning rate at step 0")
    label_smoothing: float = option(0.1, "label smoothing epsilon (paper: 0.1)")
    clip_norm: float = option(0.0, "clip gradient norm (0: off)")
    weight_decay: float = option(0.0, "weight decay")
    precision: Literal["fp32", "bf16", "fp16"] = option("fp32", "training precision")
    device: Literal["auto", "cpu", "cuda"] = option("auto", "device")
    threads: int = option(0, "CPU threads for torch (0: torch's default)")
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


@dataclass(frozen=True)
class AverageOptions:
    inputs: tuple[str, ...] = option(help="checkpoint directory (or directories) or checkpoint files")
    output: str = option(help="averaged checkpoint to write")
    num_update_checkpoints: int = option(
        0, "average the last N checkpoint_<epoch>_<update>.pt by update number (paper: 5 base, 20 big)"
    )
    num_epoch_checkpoints: int = option(0, "average the last N epoch-end checkpoints by epoch number")


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

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.batch_size < 1 or self.buffer_size < 1 or self.max_tokens < 0:
            raise ValueError("--batch-size and --buffer-size must be positive, --max-tokens non-negative")


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
