# SPDX-License-Identifier: Apache-2.0
"""Shared by the tests: a small model and KV whose every element is known."""
import numpy as np

import kdn

LAYERS, HEADS, DIM = 2, 2, 4
ROW = HEADS * DIM  # one token's K (or V) in one layer, in elements
CHUNK = 16
NS = "tests"


def runtime(**kwargs):
    kwargs.setdefault("chunk_tokens", CHUNK)
    kwargs.setdefault("tiers", [kdn.Tier.host(4 << 20)])
    return kdn.Runtime(**kwargs)


def model(rt, dtype=kdn.DType.F32, fingerprint="unit"):
    return rt.model(num_layers=LAYERS, num_kv_heads=HEADS, head_dim=DIM, dtype=dtype, fingerprint=fingerprint)


def canonical_kv(tokens, seed=0):
    """KV of `tokens` tokens in the canonical layout [layer][k|v][token][head][dim]
    (float32), every element distinct."""
    n = LAYERS * 2 * tokens * ROW
    return (np.arange(n, dtype=np.float32) + seed * 1e5).reshape(LAYERS, 2, tokens, HEADS, DIM)


def tokens(n, start=0):
    return np.arange(start, start + n, dtype=np.int32)
