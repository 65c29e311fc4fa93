#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""llama2.c checkpoint (+ tok512.bin tokenizer) -> GGUF v3, llama architecture, all F32.

Standard library only (no numpy, no gguf-py): the weights are float32 in the
checkpoint and are copied byte for byte, so no array library is needed.

Follows llama.cpp's examples/convert-llama2c-to-ggml/convert-llama2c-to-ggml.cpp
(same keys, tensor names, shapes, vocab rules), with two deliberate differences:
  * llama.context_length = the checkpoint's seq_len (the C++ tool uses its -c default 128);
  * llama.rope.freq_base = 10000 and general.file_type = 0 (ALL_F32) written explicitly.
No weight permutation: llama2.c rotates interleaved pairs (x[2i], x[2i+1]), which is
llama.cpp's LLAMA_ROPE_TYPE_NORM, the rope type of the llama architecture.

usage: llama2c_to_gguf.py stories260K.bin tok512.bin out.gguf
       llama2c_to_gguf.py --sliding-window W stories260K.bin tok512.bin out.gguf

The build runs it (integrations/llamacpp/CMakeLists.txt) to make the reference model
llama.cpp reads, and, with --sliding-window, a model of sliding-window layers for the
connector's tests: the same weights under llama.cpp's gemma3 architecture, every other
layer attending to its last W tokens (llama.cpp keeps them in a second, SWA cache), the
norms gemma3 adds (q/k norms, post-attention and post-FFN norms) set to ones. It is not a
trained Gemma: its text means nothing, and the tests use it for what does not depend on
that (KV restored by kdn continuing bit for bit as a prefill).
"""
import struct
import sys

GGUF_ALIGN = 32  # general.alignment default; we do not write the key
# GGUF value types
T_U32, T_I32, T_F32, T_STR, T_ARR = 4, 5, 6, 8, 9
# llama_token_type
TT_NORMAL, TT_UNKNOWN, TT_CONTROL, TT_BYTE = 1, 2, 3, 6
GGML_TYPE_F32 = 0
UNK_ID, BOS_ID, EOS_ID = 0, 1, 2


def read_checkpoint(path):
    """llama2.c 'legacy' format: 7 x int32 header, then float32 tensors in a fixed order."""
    data = open(path, "rb").read()
    dim, hidden, n_layers, n_heads, n_kv_heads, vocab, seq_len = struct.unpack_from("<7i", data, 0)
    shared = vocab > 0  # negative vocab_size = separate classifier (wcls) at the end
    vocab = abs(vocab)
    hd = dim // n_heads
    kvd = n_kv_heads * hd
    off = 28
    def take(n):  # n float32 values as raw little-endian bytes
        nonlocal off
        b = data[off:off + 4 * n]
        assert len(b) == 4 * n, "checkpoint truncated"
        off += 4 * n
        return b
    w = {}
    w["emb"] = take(vocab * dim)
    w["rms_att"] = take(n_layers * dim)
    w["wq"] = take(n_layers * dim * dim)
    w["wk"] = take(n_layers * dim * kvd)
    w["wv"] = take(n_layers * dim * kvd)
    w["wo"] = take(n_layers * dim * dim)
    w["rms_ffn"] = take(n_layers * dim)
    w["w1"] = take(n_layers * dim * hidden)
    w["w2"] = take(n_layers * hidden * dim)
    w["w3"] = take(n_layers * dim * hidden)
    w["rms_final"] = take(dim)
    off += seq_len * hd * 4  # skip freq_cis_real + freq_cis_imag (seq_len * hd/2 each)
    w["wcls"] = w["emb"] if shared else take(vocab * dim)
    assert off == len(data), f"trailing bytes: {off} != {len(data)}"
    cfg = dict(dim=dim, hidden=hidden, n_layers=n_layers, n_heads=n_heads,
               n_kv_heads=n_kv_heads, vocab=vocab, seq_len=seq_len, hd=hd, kvd=kvd)
    return cfg, w


def read_tokenizer(path, n_vocab):
    """tok512.bin: u32 max_token_length, then per token: f32 score, u32 len, bytes.
    Token types and texts as in convert-llama2c-to-ggml.cpp load_vocab()."""
    data = open(path, "rb").read()
    off = 4
    toks, scores, types = [], [], []
    for i in range(n_vocab):
        score, n = struct.unpack_from("<fI", data, off)
        off += 8
        text = data[off:off + n]
        off += n
        if i == UNK_ID:
            text, t = b"<unk>", TT_UNKNOWN
        elif i == BOS_ID:
            text, t = b"<s>", TT_CONTROL      # tok512.bin has "\n<s>\n"
        elif i == EOS_ID:
            text, t = b"</s>", TT_CONTROL     # tok512.bin has "\n</s>\n"
        elif not text:
            t = TT_CONTROL
        elif len(text) == 6 and text.startswith(b"<0x") and text.endswith(b">"):
            t = TT_BYTE                         # <0xNN> byte-fallback tokens
        else:
            t = TT_NORMAL
        # SentencePiece convention: spaces are stored as U+2581 '▁'
        toks.append(text.replace(b" ", "\u2581".encode()))
        scores.append(score)
        types.append(t)
    return toks, scores, types


class GGUFWriter:
    def __init__(self):
        self.kv = []       # encoded key/value records
        self.tensors = []  # (name, ne list, raw bytes)

    @staticmethod
    def _str(s):
        b = s if isinstance(s, bytes) else s.encode()
        return struct.pack("<Q", len(b)) + b

    def add_u32(self, k, v): self.kv.append(self._str(k) + struct.pack("<II", T_U32, v))
    def add_f32(self, k, v): self.kv.append(self._str(k) + struct.pack("<If", T_F32, v))
    def add_str(self, k, v): self.kv.append(self._str(k) + struct.pack("<I", T_STR) + self._str(v))

    def add_arr(self, k, elem_type, vals):
        body = struct.pack("<IIQ", T_ARR, elem_type, len(vals))
        if elem_type == T_STR:
            body += b"".join(self._str(v) for v in vals)
        else:
            body += struct.pack("<%d%s" % (len(vals), {T_F32: "f", T_I32: "i"}[elem_type]), *vals)
        self.kv.append(self._str(k) + body)

    def add_tensor(self, name, ne, raw):
        """ne in ggml order: ne[0] is the contiguous (row) length."""
        n = 1
        for d in ne:
            n *= d
        assert len(raw) == 4 * n, name
        self.tensors.append((name, ne, raw))

    def write(self, path):
        pad = lambda n: (-n) % GGUF_ALIGN
        out = bytearray(b"GGUF" + struct.pack("<IQQ", 3, len(self.tensors), len(self.kv)))
        for r in self.kv:
            out += r
        offset = 0
        for name, ne, raw in self.tensors:   # tensor infos: name, n_dims, ne[], type, offset
            out += self._str(name) + struct.pack("<I", len(ne)) + struct.pack("<%dQ" % len(ne), *ne)
            out += struct.pack("<IQ", GGML_TYPE_F32, offset)
            offset += len(raw) + pad(len(raw))
        out += b"\0" * pad(len(out))
        for name, ne, raw in self.tensors:
            out += raw + b"\0" * pad(len(raw))
        open(path, "wb").write(out)
        return len(out)


def main(ckpt, tok, out, window=0):
    c, w = read_checkpoint(ckpt)
    toks, scores, types = read_tokenizer(tok, c["vocab"])
    g = GGUFWriter()
    a = "gemma3" if window else "llama"
    g.add_str("general.architecture", a)
    g.add_str("general.name", "stories260K-swa" if window else "stories260K")
    g.add_u32("general.file_type", 0)                       # LLAMA_FTYPE_ALL_F32
    g.add_u32(a + ".context_length", c["seq_len"])
    g.add_u32(a + ".embedding_length", c["dim"])
    g.add_u32(a + ".block_count", c["n_layers"])
    g.add_u32(a + ".feed_forward_length", c["hidden"])
    g.add_u32(a + ".attention.head_count", c["n_heads"])
    g.add_u32(a + ".attention.head_count_kv", c["n_kv_heads"])
    if window:
        g.add_u32(a + ".attention.key_length", c["hd"])
        g.add_u32(a + ".attention.value_length", c["hd"])
        g.add_u32(a + ".attention.sliding_window", window)
        g.add_u32(a + ".attention.sliding_window_pattern", 2)  # layers 0, 2, 4 sliding; 1, 3 full
    else:
        g.add_u32(a + ".rope.dimension_count", min(64, c["hd"]))  # = head_dim (8)
    g.add_f32(a + ".rope.freq_base", 10000.0)
    g.add_f32(a + ".attention.layer_norm_rms_epsilon", 1e-5)
    g.add_str("tokenizer.ggml.model", "llama")              # SentencePiece-style (SPM)
    g.add_arr("tokenizer.ggml.tokens", T_STR, toks)
    g.add_arr("tokenizer.ggml.scores", T_F32, scores)
    g.add_arr("tokenizer.ggml.token_type", T_I32, types)
    g.add_u32("tokenizer.ggml.unknown_token_id", UNK_ID)
    g.add_u32("tokenizer.ggml.bos_token_id", BOS_ID)
    g.add_u32("tokenizer.ggml.eos_token_id", EOS_ID)
    # (the C++ tool also writes sep/pad = LLAMA_TOKEN_NULL as u32 0xFFFFFFFF; omitted = none)

    D, H, L, KVD = c["dim"], c["hidden"], c["n_layers"], c["kvd"]
    # llama2.c matrices are row-major (out, in): ggml ne = [in, out], same bytes.
    g.add_tensor("token_embd.weight", [D, c["vocab"]], w["emb"])
    g.add_tensor("output_norm.weight", [D], w["rms_final"])
    if not window:
        g.add_tensor("output.weight", [D, c["vocab"]], w["wcls"])  # gemma3 ties it to token_embd
    def layer(key, i, n):
        return w[key][i * n * 4:(i + 1) * n * 4]
    def ones(n):
        return struct.pack("<%df" % n, *([1.0] * n))
    for i in range(L):
        g.add_tensor(f"blk.{i}.attn_q.weight", [D, D], layer("wq", i, D * D))
        g.add_tensor(f"blk.{i}.attn_k.weight", [D, KVD], layer("wk", i, D * KVD))
        g.add_tensor(f"blk.{i}.attn_v.weight", [D, KVD], layer("wv", i, D * KVD))
        g.add_tensor(f"blk.{i}.attn_output.weight", [D, D], layer("wo", i, D * D))
        g.add_tensor(f"blk.{i}.attn_norm.weight", [D], layer("rms_att", i, D))
        g.add_tensor(f"blk.{i}.ffn_gate.weight", [D, H], layer("w1", i, D * H))
        g.add_tensor(f"blk.{i}.ffn_down.weight", [H, D], layer("w2", i, H * D))
        g.add_tensor(f"blk.{i}.ffn_up.weight", [D, H], layer("w3", i, D * H))
        g.add_tensor(f"blk.{i}.ffn_norm.weight", [D], layer("rms_ffn", i, D))
        if window:
            g.add_tensor(f"blk.{i}.attn_q_norm.weight", [c["hd"]], ones(c["hd"]))
            g.add_tensor(f"blk.{i}.attn_k_norm.weight", [c["hd"]], ones(c["hd"]))
            g.add_tensor(f"blk.{i}.post_attention_norm.weight", [D], ones(D))
            g.add_tensor(f"blk.{i}.post_ffw_norm.weight", [D], ones(D))
    n = g.write(out)
    print(f"{out}: {n} bytes, {len(g.tensors)} tensors, {len(g.kv)} keys")


if __name__ == "__main__":
    args = sys.argv[1:]
    window = 0
    if len(args) == 5 and args[0] == "--sliding-window":
        window = int(args[1])
        args = args[2:]
    if len(args) != 3 or (len(sys.argv) == 6 and window <= 0):
        sys.exit(__doc__)
    main(*args, window=window)
