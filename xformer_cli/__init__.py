"""xf: neural machine translation with the Transformer of "Attention Is All You Need".

The library is usable from Python::

    from xformer_cli import build_model
    model = build_model("base", vocab_size=37000)        # 63.1M parameters
"""

__version__ = "0.1.0"


def __getattr__(name):  # lazy: `xf --help` and `xf score` do not import torch
    if name in ("build_model", "model_config", "Transformer", "ModelConfig", "PRESETS"):
        from .model import transformer as model

        return getattr(model, name)
    raise AttributeError(name)


__all__ = ["__version__", "build_model", "model_config", "Transformer", "ModelConfig", "PRESETS"]
