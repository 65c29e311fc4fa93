# SPDX-License-Identifier: Apache-2.0
"""kdn's value types: configuration in (Tier, ModelSpec) and results out."""
import array
import dataclasses
from typing import Any, Mapping, NamedTuple, Optional, Sequence, Tuple, Union

from ._enums import CacheKind, DType, EvictionPolicy, OpState, RopeStyle, SegmentKind, Status, TierKind

__all__ = [
    "Tier", "ModelSpec", "KvResult", "LookupResult", "DocumentInfo", "FetchResult", "Stats", "Latency",
    "TierStats", "QuotaStats", "ChunkInfo", "RESULT_LOSSY", "Segment", "BlendReport",
]

#: KvResult.flags: some of the KV written was decoded from a lossy codec.
RESULT_LOSSY = 0x1

Text = Union[str, bytes]


@dataclasses.dataclass
class Tier:
    """One tier of a runtime's store (kdn_tier_config); kdn.h's defaults.

    Use the constructors: ``Tier.host(16 << 20)``, ``Tier.disk("/var/kdn",
    64 << 30)``, ``Tier.remote("host:7070", token="...")``,
    ``Tier.redis("10.0.0.1:7000,10.0.0.2:7000", password="...", ttl_ms=...)``.

    high_watermark / low_watermark: 0 means kdn's defaults (0.95 / 0.85).
    codec: "" is raw for memory tiers, lossless "zstd" for disk and remote
    tiers, lossy "kdn:balanced" for redis tiers; an unknown codec is refused
    (InvalidArgumentError). timeout_ms: a remote or redis tier's deadline per
    call (0: 2000). user, ttl_ms (since 1.3): a redis tier's ACL user (needs
    a password) and the time after which its keys expire (0: never); other
    kinds refuse them (InvalidArgumentError).

    policy: EvictionPolicy.LRU, S3FIFO, or COST (since 1.5: keeps what saves
    the most prefill time per byte held). levels (since 1.6, remote and
    redis tiers, without a codec): quality levels, codec specs finest first,
    as a list or one ';'-separated string (["zstd", "kdn:hifi",
    "kdn:balanced"]); a load with a TTFT target (ttft_target_us) fetches each
    chunk at the finest level that arrives in time, and leaves the chunks no
    level would to recompute.

    quotas (since 1.13; not for remote tiers, whose kdnd has its own):
    namespaces' quotas in this tier, ``{"tenant-a": 64 << 20}`` or
    ``[("tenant-a", 64 << 20), ...]`` (namespaces str or bytes, as the KV
    calls name them): a namespace's chunks take at most that many bytes of
    the tier, as it counts its capacity (a memory tier: whole 4 KiB pages
    per chunk). Over it, the namespace's stores evict its own coldest chunks,
    never another's; a chunk larger than its quota goes to the next tier.
    A full tier evicts the chunks of namespaces without a quota first. One
    quota per namespace (a second, or one on a remote tier:
    InvalidArgumentError from the Runtime). Runtime.quota_stats reports them.
    """
    kind: TierKind = TierKind.HOST
    capacity_bytes: int = 1 << 30
    path: Text = ""
    policy: EvictionPolicy = EvictionPolicy.LRU
    high_watermark: float = 0.0
    low_watermark: float = 0.0
    write_through: bool = False
    codec: Text = ""
    address: Text = ""
    token: Text = ""
    timeout_ms: int = 0
    tls_ca_file: Text = ""
    tls_server_name: Text = ""
    user: Text = ""
    ttl_ms: int = 0
    levels: Union[Text, Tuple[Text, ...], list] = ""
    quotas: Union[Mapping[Text, int], Sequence[Tuple[Text, int]]] = ()

    @classmethod
    def host(cls, capacity_bytes=1 << 30, **kwargs):
        """Host memory (pinned when a GPU is present)."""
        return cls(TierKind.HOST, capacity_bytes, **kwargs)

    @classmethod
    def device(cls, capacity_bytes=1 << 30, **kwargs):
        """GPU memory (host memory standing in for it without a GPU)."""
        return cls(TierKind.DEVICE, capacity_bytes, **kwargs)

    @classmethod
    def disk(cls, path, capacity_bytes=1 << 30, **kwargs):
        """One file per chunk under `path` (created if absent)."""
        return cls(TierKind.DISK, capacity_bytes, path, **kwargs)

    @classmethod
    def remote(cls, address, token="", **kwargs):
        """A kdnd node ("host:port" or "unix:/path") shared with other engines."""
        return cls(TierKind.REMOTE, address=address, token=token, **kwargs)

    @classmethod
    def redis(cls, address, password="", **kwargs):
        """Redis, Redis Cluster or Valkey shared with other engines (since
        1.3): "host:port" of one node or more, comma-separated; password
        "" for no AUTH. A malformed address or a refused AUTH fails the
        Runtime; a server that is not there is missed until it answers."""
        return cls(TierKind.REDIS, address=address, token=password, **kwargs)


@dataclasses.dataclass
class ModelSpec:
    """The shape of a model's KV and what identifies its weights
    (kdn_model_spec). KV is only returned to a model with the same spec and
    fingerprint. fingerprint: str or bytes, not empty (weights, tokenizer,
    layout, TP rank, adapters: anything that changes the KV).
    cache_kind=CacheKind.LATENT (since 1.11): each layer caches one vector
    of latent_dim per token, its last latent_rope_dim carrying RoPE;
    num_kv_heads and head_dim are then 0, and KV buffers hold the latent
    ([layer][token][latent_dim] in the canonical layout).
    layer_windows (since 1.12): each layer's sliding window in tokens, 0 for
    full attention (empty: all full): a load then writes a sliding layer's
    window only, and a lookup reports the prefix every group serves.
    num_state_layers / state_bytes: recurrent layers (not in num_layers),
    each with a state of state_bytes (a positive multiple of 4); their
    states travel with each call (Model.store / retrieve / load_async /
    save_async's `states`), and a prefix counts only where the state at its
    end was stored."""
    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: DType = DType.F32
    fingerprint: Text = ""
    rope_theta: float = 10000.0
    rope_style: RopeStyle = RopeStyle.INTERLEAVED
    rotary_dim: int = 0
    cache_kind: CacheKind = CacheKind.KV
    latent_dim: int = 0
    latent_rope_dim: int = 0
    layer_windows: Sequence[int] = ()
    num_state_layers: int = 0
    state_bytes: int = 0

    @property
    def kv_bytes_per_token(self):
        """Bytes of KV per token: layers x 2 x heads x head_dim x element size
        (a latent model: layers x latent_dim x element size)."""
        if self.cache_kind == CacheKind.LATENT:
            return self.num_layers * self.latent_dim * DType(self.dtype).itemsize
        return self.num_layers * 2 * self.num_kv_heads * self.head_dim * DType(self.dtype).itemsize


class KvResult(NamedTuple):
    """What a KV call did. tokens: store/save: leading tokens cached after
    it; retrieve/load: tokens written (0 on a miss); fetch: the document's
    length. covered: the cached prefix found. num_failed: ranges of a load
    that could not be read."""
    state: OpState
    status: Status
    tokens: int
    covered: int
    num_failed: int
    flags: int

    @property
    def lossy(self):
        """Some of the KV written was decoded from a lossy codec."""
        return bool(self.flags & RESULT_LOSSY)

    @classmethod
    def _native(cls, t):
        return cls(OpState(t[0]), Status(t[1]), t[2], t[3], t[4], t[5])


class LookupResult(NamedTuple):
    """One request's lookup: its status (Status.OK, or why this request of a
    batch failed), the leading tokens cached in some tier, and per tier the
    leading tokens that tier alone holds."""
    status: Status
    cached_tokens: int
    tier_tokens: Tuple[int, ...]


class DocumentInfo(NamedTuple):
    """A knowledge item. expires_in_ms: -1 when it never expires. Since 1.4:
    hits, chunks of it served (fetches, blends) since this version was put;
    pin_expires_in_ms, pinned with a TTL: ms until the pin ends, -1 when not
    pinned or pinned until unpinned."""
    doc_id: str
    pinned: bool
    version: int
    num_tokens: int
    chunks: int
    chunks_present: int
    expires_in_ms: int
    hits: int
    pin_expires_in_ms: int


class FetchResult(NamedTuple):
    """A fetched document: the call's result and the document's tokens."""
    result: KvResult
    tokens: array.array


@dataclasses.dataclass(frozen=True)
class Stats:
    """A runtime's counters (kdn_stats)."""
    lookups: int
    retrieves: int
    stores: int
    hits: int
    misses: int
    tokens_served: int
    tokens_stored: int
    bytes_served: int
    bytes_stored: int
    chunks: int
    used_bytes: int
    capacity_bytes: int
    evictions: int
    edited_served: int
    leases_active: int
    pins_active: int
    pins_forced_unpin: int
    corrupt_detected: int
    edits: int
    # Since 1.4.
    tokens_requested: int  #: tokens loads asked for: the hit rate is tokens_served / this
    prefill_tokens: int  #: tokens whose prefills engines reported (Model.report_prefill)
    prefill_ns: int  #: the time those prefills took
    ttft_saved_ns: int  #: prefill time loads saved (tokens served x the model's mean reported ns per token)
    tokens_served_unpriced: int  #: tokens served while their model had no report (not in ttft_saved_ns)
    delivery_ns: int  #: time spent in loads (retrieves and load ops), hits and misses
    lookup_tokens: int  #: tokens the looked-up requests covered
    lookup_hit_tokens: int  #: of them, the leading tokens found cached (LookupResult.cached_tokens)
    # Since 1.7.
    recompute_tokens: int  #: cached tokens loads left to recompute: their tiers deliver slower than prefill


class Latency(NamedTuple):
    """A latency distribution, in microseconds."""
    count: int
    mean_us: float
    p50_us: float
    p90_us: float
    p99_us: float
    max_us: float


@dataclasses.dataclass(frozen=True)
class TierStats:
    """One tier's counters (kdn_tier_stats)."""
    kind: TierKind
    name: str
    codec: str
    hits: int
    misses: int
    puts: int
    put_refusals: int
    evictions: int
    demotions_in: int
    promotions_in: int
    bytes_in: int
    bytes_out: int
    objects: int
    used_bytes: int
    capacity_bytes: int
    corrupt_detected: int
    encoded_chunks: int
    bytes_before_encoding: int
    bytes_after_encoding: int
    encode_failures: int
    decode_failures: int
    io_errors: int
    remote_calls: int
    remote_failed_calls: int
    remote_timeouts: int
    write_queue_full: int
    write_queued_bytes: int
    # Since 1.4: fractions of capacity; a put that would cross high evicts
    # first, down to low. 0.0 and 0.0: the tier has none (remote, redis).
    high_watermark: float
    low_watermark: float
    # Since 1.7: how fast the tier delivers into host and device views (ns
    # per token of KV, a moving average of its loads; 0.0 until measured),
    # and its chunks loads left to recompute as slower than the prefill.
    delivery_ns_per_token: float
    device_delivery_ns_per_token: float
    recompute_chunks: int
    # Since 1.8: of corrupt_detected, the chunks whose seal failed (a runtime
    # with a secret_file: none, another secret's, or a MAC that does not match).
    auth_failures: int


class QuotaStats(NamedTuple):
    """One namespace's quota in a tier, now (kdn_quota_stats; since 1.13)."""
    ns: Text  #: the namespace, as Tier.quotas gave it
    ns_hash: bytes  #: the namespace's hash (32 bytes), as chunk envelopes record it
    quota_bytes: int
    used_bytes: int  #: its chunks' bytes the tier holds
    objects: int  #: its chunks the tier holds
    quota_evictions: int  #: its chunks evicted to keep it within its quota (by its own stores)
    room_evictions: int  #: its chunks evicted for the tier's room (the tier full of quota'd chunks)
    refused: int  #: its chunks refused here: larger than its quota


class ChunkInfo(NamedTuple):
    """A stored chunk, as an editor sees it. first_position: -1 when the
    chunk is position-free (a knowledge item's)."""
    num_layers: int
    num_kv_heads: int
    head_dim: int
    num_tokens: int
    dtype: DType
    first_position: int


class Segment(NamedTuple):
    """One piece of a blended context (Model.blend, experimental): a
    document by doc_id (a knowledge item), or tokens computed now (the
    query). Model.blend also takes a str as a document and a sequence of
    ints (or an int32 buffer) as tokens."""
    kind: SegmentKind
    doc_id: Optional[Text] = None
    tokens: Any = None

    @classmethod
    def document(cls, doc_id):
        """A knowledge item, by its doc_id (str or bytes)."""
        return cls(SegmentKind.DOCUMENT, doc_id, None)

    @classmethod
    def of_tokens(cls, tokens):
        """Tokens computed now: a sequence of ints or an int32 buffer."""
        return cls(SegmentKind.TOKENS, None, tokens)


class BlendReport(NamedTuple):
    """What a blend did: the composed context's positions, of them those
    placed from documents and those computed now, the cached positions
    recomputed past the last check layer, and the fraction of a full
    prefill's layer x position work that was recomputed (KV passes counted
    at kv_cost).

    Since 1.9: anchored, the cached positions recomputed at every layer
    (first_tokens); kv_passes, the positions x layers given only a KV pass
    (kv_fn); ratio, the ratio used (the method's default resolved: 0.28 with
    kv_fn, 0.15 without); num_check_layers, the check layers used; gated,
    whether the accuracy gate (gate_file) refused the method, so that every
    position was recomputed; gate_kl_ratio, the gate file's KL ratio for the
    method (-1: no record, or no gate)."""
    positions: int
    cached_positions: int
    fresh_positions: int
    selected: int
    recompute_fraction: float
    anchored: int = 0
    kv_passes: int = 0
    ratio: float = 0.0
    num_check_layers: int = 0
    gated: bool = False
    gate_kl_ratio: float = -1.0
