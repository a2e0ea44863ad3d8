"""Measure the tensors torchtitan's own Llama block saves for the backward (issue #13's TP003
xfail, ``tests/golden/test_plan_published_best.py``): bytes per token, in units of the hidden
size, next to what memplan's estimate of that run holds.

One ``TransformerBlock`` of torchtitan 0.2.0's Llama 3 model, at Llama-2-13B's shapes (dim 5120,
40 heads, ``multiple_of`` 256: FFN 13,824), bf16 weights and input, one forward on CPU
(torch 2.13; SDPA). Every tensor autograd saves is counted through
``torch.autograd.graph.saved_tensors_hooks``, each storage once; the block's parameters, its
input (the previous block's output) and the rotary table are left out. The same count for
transformers' ``LlamaDecoderLayer`` at the same shapes stands beside it (the graph memplan
follows). Writes ``validation/torchtitan_block.json``.

torchtitan's package ``__init__`` imports its MoE Triton kernels, and ``model.py`` imports
``protocols.train_spec`` for one type, which pulls in the data loader and TensorBoard: none of
them is used by a dense block, none is installed by the test extra. The script registers the
packages without running their ``__init__`` and gives ``train_spec`` the protocol alone.

Usage: ``PYTHONPATH=src python scripts/measure_torchtitan_block.py [--seq 256 512]``
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import os
import sys
import types
from collections.abc import Callable
from pathlib import Path

import torch

OUT = Path(__file__).resolve().parent.parent / "validation" / "torchtitan_block.json"
HIDDEN, HEADS = 5120, 40


@functools.cache
def _import_block() -> tuple[type, type, object]:
    root = os.path.dirname(importlib.util.find_spec("torchtitan").origin)  # type: ignore[arg-type]
    for name, sub in (("torchtitan", ""), ("torchtitan.models", "models"),
                      ("torchtitan.models.llama3", "models/llama3")):
        pkg = types.ModuleType(name)
        pkg.__path__ = [os.path.join(root, sub)]  # type: ignore[attr-defined]
        sys.modules[name] = pkg
    from torchtitan.protocols.model import ModelProtocol

    spec = types.ModuleType("torchtitan.protocols.train_spec")
    spec.ModelProtocol = ModelProtocol  # type: ignore[attr-defined]
    sys.modules["torchtitan.protocols.train_spec"] = spec
    from torchtitan.models.llama3.model.args import TransformerModelArgs
    from torchtitan.models.llama3.model.model import TransformerBlock, precompute_freqs_cis

    return TransformerModelArgs, TransformerBlock, precompute_freqs_cis


def _saved(module: torch.nn.Module, run: Callable[[], object],
           inputs: tuple[torch.Tensor, ...]) -> int:
    """Bytes autograd saves while ``run()`` calls ``module`` forward: each storage once, without
    the module's parameters and ``inputs`` (the block input, rotary tables)."""
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        st = t.untyped_storage()
        seen[st.data_ptr()] = st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        run()
    own = {p.untyped_storage().data_ptr() for p in module.parameters()}
    own |= {t.untyped_storage().data_ptr() for t in inputs}
    return sum(n for ptr, n in seen.items() if ptr not in own)


def saved_bytes(seq: int) -> int:
    """Bytes torchtitan's block saves for its backward at ``seq`` tokens (one sequence)."""
    args_cls, block_cls, freqs_of = _import_block()
    args = args_cls(dim=HIDDEN, n_layers=40, n_heads=HEADS, vocab_size=32000, multiple_of=256,
                    max_seq_len=seq)
    block = block_cls(0, args).to(torch.bfloat16)
    freqs = freqs_of(HIDDEN // HEADS, seq, args.rope_theta)
    x = torch.randn(1, seq, HIDDEN, dtype=torch.bfloat16, requires_grad=True)
    return _saved(block, lambda: block(x, freqs, None), (x, freqs))


def hf_saved_bytes(seq: int) -> int:
    """The same count for transformers' ``LlamaDecoderLayer`` (SDPA) at the same shapes: the
    HF Llama graph memplan's estimate follows for every Llama-family engine."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

    cfg = LlamaConfig(hidden_size=HIDDEN, num_attention_heads=HEADS, num_key_value_heads=HEADS,
                      intermediate_size=13824, num_hidden_layers=1, attn_implementation="sdpa")
    layer = LlamaDecoderLayer(cfg, 0).to(torch.bfloat16)
    x = torch.randn(1, seq, HIDDEN, dtype=torch.bfloat16, requires_grad=True)
    pos = torch.arange(seq)[None]
    cos, sin = LlamaRotaryEmbedding(cfg)(x, pos)
    return _saved(layer, lambda: layer(x, position_embeddings=(cos, sin), attention_mask=None,
                                       position_ids=pos), (x, cos, sin))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seq", type=int, nargs="+", default=[256, 512])
    seqs = ap.parse_args().seq
    rows = [{"seq": s, "saved_bytes": (b := saved_bytes(s)),
             "bytes_x_hidden_per_token": round(b / (s * HIDDEN), 3),
             "hf_saved_bytes": (hf := hf_saved_bytes(s)),
             "hf_bytes_x_hidden_per_token": round(hf / (s * HIDDEN), 3)} for s in seqs]
    out = {"what": "tensors saved for backward by one torchtitan 0.2.0 Llama TransformerBlock "
                   "(hf_: one transformers LlamaDecoderLayer, SDPA) at Llama-2-13B shapes, "
                   "bf16, CPU, storages once, parameters, block input and rotary tables "
                   "excluded",
           "command": "PYTHONPATH=src python scripts/measure_torchtitan_block.py",
           "torch": torch.__version__, "rows": rows}
    OUT.write_text(json.dumps(out, indent=1) + "\n")
    for r in rows:
        print(f"seq {r['seq']}: torchtitan {r['saved_bytes']:,} B saved = "
              f"{r['bytes_x_hidden_per_token']} bytes x hidden per token; HF "
              f"{r['hf_bytes_x_hidden_per_token']}")


if __name__ == "__main__":
    main()
