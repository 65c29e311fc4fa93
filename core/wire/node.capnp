# kdnd's RPC interface: a node that holds chunks for many engines.
#
# A client connects (TCP or a Unix socket), asks the bootstrap capability
# (KdnNode) for a Session with a bearer token, and makes every call on that
# session: the session carries what the token grants (a set of tenant
# namespaces, and whether it may read the node's statistics), and every call
# is checked against it. A call that fails returns a typed Error in its
# results; the connection stays up.
#
# Chunks travel as chunk envelopes (wire/chunk.capnp), exactly as the node
# stores them: a payload encoded by a codec stays encoded on the wire and is
# decoded by the runtime that receives it. The node checks every envelope it
# is given (both checksums, the namespace) and stores nothing it cannot
# check. A put is atomic per chunk: a reader sees the whole chunk or none.
#
# Keys are the runtime's chunk keys (SHA-256 digests, 32 bytes). Calls name
# their namespace by its hash (`namespace`: the envelope's namespaceHash,
# SHA-256 over "kdn-namespace-v1" and the name, each length-prefixed as in
# keys/hash.h), which the session's token must grant. The
# node files each key under its namespace (its objects are keyed by
# SHA-256("kdnd/1", namespace hash, key)): the same key in two namespaces
# names two objects, and a session granted namespace A can neither read,
# list nor learn of namespace B's keys (a call in B is refused before any
# key is looked at).
#
# Evolution rules (as in chunk.capnp): a field or a method takes the next
# ordinal; an ordinal is never renumbered nor reused; a field's meaning never
# changes. `protocolVersion` counts such additions; clients read it from
# health() and use a method only when the node's version has it. An unknown
# method gets Cap'n Proto's `unimplemented` exception, nothing worse.
@0xb5f0c3a1e2d49a77;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("kdn::wire::node");

const protocolVersion :UInt32 = 1;

# Limits the node enforces (a request beyond them gets tooLarge).
const maxKeysPerCall :UInt32 = 65536;
const maxEnvelopeBytes :UInt64 = 268435456;  # 256 MiB: one envelope piece

enum ErrorCode {
  ok @0;
  invalidArgument @1;    # malformed request: a key or namespace hash that is not 32 bytes
  unauthenticated @2;    # no such token
  permissionDenied @3;   # the token does not grant this namespace (or statistics)
  tooLarge @4;           # beyond the limits above
  corrupt @5;            # an envelope that fails its checks
  busy @6;               # the node cannot take the chunk now (full, or shutting down)
  unavailable @7;        # the node is draining
  internal @8;
}

struct Error {
  code @0 :ErrorCode;
  message @1 :Text;
}

struct Health {
  serving @0 :Bool;       # false while draining for shutdown
  version @1 :Text;       # kdn's version
  protocol @2 :UInt32;    # protocolVersion of the node
  uptimeMs @3 :UInt64;
}

interface KdnNode {
  # Needs no token: whether the node serves.
  health @0 () -> (health :Health);
  # A session for a bearer token. An unknown token gets `unauthenticated`
  # and no session (tokens are compared in constant time).
  login @1 (token :Text) -> (error :Error, session :Session);
}

# The chained keys of one request's chunks, in order.
struct LookupRequest {
  keys @0 :List(Data);
  tokens @1 :UInt64;      # tokens the request covers (statistics: requested tokens)
}

struct LookupResult {
  prefix @0 :UInt32;      # leading keys the node holds
}

struct GetResult {
  union {
    missing @0 :Void;
    envelope @1 :Data;    # the chunk as stored (wire/chunk.capnp)
  }
}

struct Latency {
  count @0 :UInt64;
  sumUs @1 :Float64;
  p50Us @2 :Float64;
  p90Us @3 :Float64;
  p99Us @4 :Float64;
  maxUs @5 :Float64;
}

struct TierStats {
  name @0 :Text;
  kind @1 :Text;                 # host, disk
  codec @2 :Text;
  objects @3 :UInt64;
  usedBytes @4 :UInt64;
  capacityBytes @5 :UInt64;
  hits @6 :UInt64;
  misses @7 :UInt64;
  puts @8 :UInt64;
  evictions @9 :UInt64;
  demotionsIn @10 :UInt64;
  promotionsIn @11 :UInt64;
  corruptDetected @12 :UInt64;
  bytesIn @13 :UInt64;
  bytesOut @14 :UInt64;
  highWatermark @15 :Float64;
  lowWatermark @16 :Float64;
}

struct Stats {
  timeMs @0 :UInt64;             # the node's wall clock (ms since the epoch)
  uptimeMs @1 :UInt64;
  tiers @2 :List(TierStats);
  lookups @3 :UInt64;            # lookup requests (one per LookupRequest)
  requestedTokens @4 :UInt64;    # tokens those requests covered
  hitTokens @5 :UInt64;          # tokens of the chunks served by get
  lookupHitTokens @6 :UInt64;    # tokens of the prefixes lookups found (when the request gave tokens)
  getChunks @7 :UInt64;
  getMisses @8 :UInt64;
  getBytes @9 :UInt64;
  putChunks @10 :UInt64;
  putBytes @11 :UInt64;
  putRefused @12 :UInt64;        # corrupt, foreign-namespace or unstorable chunks
  deletes @13 :UInt64;
  authFailures @14 :UInt64;      # unknown tokens, and calls outside a token's grant
  sessions @15 :UInt64;          # sessions open now
  lookupUs @16 :Latency;
  getUs @17 :Latency;
  putUs @18 :Latency;
  ttftSavedMs @19 :Float64;      # hit tokens x the configured prefill time per token
}

# Receives statistics pushed by the node every intervalMs.
interface StatsSink {
  push @0 (stats :Stats) -> stream;
}

# Held by a subscriber; dropping it (or the connection) ends the pushes.
interface Subscription {}

interface Session {
  # Per request, the leading keys the node holds.
  lookup @0 (namespace :Data, requests :List(LookupRequest)) -> (error :Error, results :List(LookupResult));
  # The chunks, in the order of `keys` (missing where not held).
  get @1 (namespace :Data, keys :List(Data)) -> (error :Error, chunks :List(GetResult));
  # Stores envelopes, each of this namespace (its namespaceHash); one Error
  # per envelope.
  put @2 (namespace :Data, envelopes :List(Data)) -> (error :Error, results :List(Error));
  # Removes the chunks from every tier; how many were held.
  delete @3 (namespace :Data, keys :List(Data)) -> (error :Error, erased :UInt32);
  # Pins held chunks against eviction for ttlMs (0: until unpinned); how many were pinned.
  pin @4 (namespace :Data, keys :List(Data), ttlMs :UInt64) -> (error :Error, pinned :UInt32);
  unpin @5 (namespace :Data, keys :List(Data)) -> (error :Error, unpinned :UInt32);
  # The node's statistics (needs a token with stats granted).
  stats @6 () -> (error :Error, stats :Stats);
  # Pushes statistics to `sink` every intervalMs (at least 50) until the
  # subscription is dropped (needs stats granted).
  subscribeStats @7 (intervalMs :UInt32, sink :StatsSink) -> (error :Error, subscription :Subscription);
}
