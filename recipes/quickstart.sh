#!/usr/bin/env bash
# What `make demo` runs. Until the pipeline lands it checks the install and builds the model.
set -euo pipefail
xf --version
python -c "from xformer_cli import build_model; m = build_model('base', vocab_size=37000); print(f'base: {m.num_parameters()/1e6:.1f}M parameters')"
