# SPDX-License-Identifier: Apache-2.0
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
# check; it keeps an envelope as it came, and a get returns those bytes
# (a chunk it moved to disk comes back framed anew, the same chunk). A put
# is atomic per chunk: a reader sees the whole chunk or none.
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

# Version 1: health, login; lookup, get, put, delete, pin, unpin, stats,
# subscribeStats. Version 2 added knowledge items (documents registered on
# the node): KnowledgeItem, KnowledgeInfo, the Session methods knowledgePut,
# knowledgeList, knowledgePin and knowledgeDelete, the error code notFound,
# the limits maxDocIdBytes and maxMetadataBytes, and Stats.documents and
# Stats.registryLoadFailures. Version 3 added TierStats.limitBytesPerS.
# Version 4 added Session.report (RequestReport), the Stats of engine
# requests (engineLookups ... engineLoadHitTokens) and TierStats.ioErrors.
# Version 5 added Stats.quotas (NamespaceQuota): the namespaces' quotas in
# the node's tiers, their use and evictions.
const protocolVersion :UInt32 = 5;

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
  notFound @9;           # (version 2) no such document: (namespace, model, docId) is not registered
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
  # A node with a deployment secret (server.secret_file) seals each envelope
  # it sends: the 48-byte trailer of wire/seal.h over the envelope's bytes.
  # A runtime with the secret takes only envelopes whose seal it can check.
  seal @2 :Data;
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
  kind @1 :Text;                 # host, disk, remote, redis, device
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
  limitBytesPerS @17 :Float64;   # the tier's read rate measured at start (bytes/s); 0: not measured
  ioErrors @18 :UInt64;          # (version 4) reads and writes of the tier that failed
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
  documents @20 :UInt64;         # (version 2) knowledge items registered on the node now
  registryLoadFailures @21 :UInt64;  # (version 2) registry files that could not be read at start (the node started empty)
  connections @22 :UInt64;          # connections open now (RPC and HTTP)
  connectionsRefused @23 :UInt64;   # closed as they came (server.max_connections)
  acceptErrors @24 :UInt64;         # accepts that failed (the listener went on after a pause)
  connectionsDropped @25 :UInt64;   # closed for a bound (no login in time, a stalled message, ...)
  repliesCapped @26 :UInt64;        # get replies cut at server.max_reply_bytes
  subscriptions @27 :UInt64;        # statistics subscriptions open now
  subscriptionsRefused @28 :UInt64; # subscribeStats refused (server.max_subscriptions, per connection too)
  # (version 4) What runtimes reported of their engines' requests (report):
  # the hit rates engines see of this node, one count per engine request
  # rather than per probe (lookups and requestedTokens above count each
  # key run a runtime asked about, several per request).
  engineLookups @29 :UInt64;         # engine lookups (and loads' lookups) that asked this node
  engineLookupTokens @30 :UInt64;    # tokens those requests had
  engineLookupHitTokens @31 :UInt64; # leading tokens of them this node held
  engineLoads @32 :UInt64;           # engine loads (retrieves) that could read from this node
  engineLoadTokens @33 :UInt64;      # tokens those loads asked for
  engineLoadHitTokens @34 :UInt64;   # tokens this node delivered to them
  # (version 5) The namespaces with a quota in the node's tiers (its config's
  # tier.quotas, one row per tier and namespace configured, in the config's
  # order): bounded by the config, never by what clients send.
  quotas @35 :List(NamespaceQuota);
}

# (version 5) One namespace's quota in one of the node's tiers, now. The
# counters are cumulative since the node started.
struct NamespaceQuota {
  tier @0 :Text;             # the tier's name (TierStats.name)
  ns @1 :Text;               # the namespace, as the node's config names it
  tierIndex @2 :UInt32;      # the tier's place in the chain (its index in Stats.tiers)
  quotaBytes @3 :UInt64;     # the most bytes of the tier its chunks may take
  usedBytes @4 :UInt64;      # its chunks' bytes the tier holds
  objects @5 :UInt64;        # its chunks the tier holds
  quotaEvictions @6 :UInt64; # its chunks evicted to keep it within its quota (its own puts)
  roomEvictions @7 :UInt64;  # its chunks evicted for the tier's room (the tier full of quota'd chunks)
  refused @8 :UInt64;        # its puts refused by the tier: one chunk larger than its quota
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

  # ---- Version 2: knowledge items (see KnowledgeItem below) ----
  # A document is named by (namespace, model, docId). Each call checks its
  # namespace against the grant as the data calls do: a token cannot list,
  # pin, delete nor learn of another namespace's documents.
  #
  # Registers a document; a put of a registered (namespace, model, docId)
  # replaces it: its old chunks lose that document's reference (they are not
  # erased), registeredMs and hits start again, and a pin carries over to
  # the new chunks. The same version with the same keys again (an engine
  # registering after a restart) only updates metadata and tokens. Beyond
  # the node's configured bounds: busy (documents, keys of all documents)
  # or tooLarge (one document's keys, docId, metadata). Registering a
  # document does not store chunks: its keys name chunks put (before or
  # after) with put.
  knowledgePut @8 (namespace :Data, item :KnowledgeItem) -> (error :Error);
  # The namespace's documents, each with what the node knows of it now.
  knowledgeList @9 (namespace :Data) -> (error :Error, items :List(KnowledgeInfo));
  # Pins (pin = true) the document's chunks against eviction for ttlMs (0:
  # until unpinned; pinning again replaces the document's deadline), or
  # unpins them (pin = false), leaving pinned those another pinned document
  # shares. `pinned`: the document's chunks held pinned after the call.
  # Chunks put later while the document is pinned are pinned as they come.
  knowledgePin @10 (namespace :Data, docId :Text, model :Data, pin :Bool, ttlMs :UInt64) -> (error :Error, pinned :UInt32);
  # Unregisters the document and erases its chunks that no other registered
  # document references, from every tier; `erased`: how many were held.
  knowledgeDelete @11 (namespace :Data, docId :Text, model :Data) -> (error :Error, erased :UInt32);

  # ---- Version 4 ----
  # A runtime's account of its engines' requests in the namespace since its
  # last report (it sends them in the background, coalesced): what the node's
  # engine* statistics and hit ratios count.
  report @12 (namespace :Data, report :RequestReport) -> (error :Error);
}

# (version 4) Counts of engine requests, as the runtime that served them saw
# this node: a lookup's tokens and the leading tokens the node held; a load's
# tokens and those the node delivered.
struct RequestReport {
  lookups @0 :UInt64;
  lookupTokens @1 :UInt64;
  lookupHitTokens @2 :UInt64;
  loads @3 :UInt64;
  loadTokens @4 :UInt64;
  loadHitTokens @5 :UInt64;
  # The engine's model: its fingerprint digest (32 bytes; kdn_model_get_fingerprint).
  # Empty from older runtimes: counted under model "unknown".
  model @6 :Data;
}

# ---- Version 2: knowledge items -------------------------------------------------
#
# A knowledge item is a document (a retrieved passage, a system prompt, a
# file) whose KV a runtime stored on the node as ordinary chunks of one
# namespace. Registering it lets operators and engines see which chunks make
# which document, how much of it the node still holds and how often it is
# served, and pin or delete it as a whole. A chunk may belong to several
# documents: pins and erasures are counted per chunk.

# Limits of one document (beyond them: tooLarge); a document has at most
# maxKeysPerCall keys, and the node holds a configured number of documents
# (beyond it: busy).
const maxDocIdBytes :UInt32 = 1024;
const maxMetadataBytes :UInt32 = 65536;

struct KnowledgeItem {
  docId @0 :Text;          # 1 to maxDocIdBytes bytes
  version @1 :UInt64;      # the writer's version of the document
  metadata @2 :Text;       # anything the writer wants listed (JSON, say); at most maxMetadataBytes
  tokens @3 :UInt64;       # the document's length in tokens
  model @4 :Data;          # the 32-byte model fingerprint its KV is of
  keys @5 :List(Data);     # the stored keys of its chunks, in order, 32 bytes each: the keys of get and put in this namespace
}

struct KnowledgeInfo {
  docId @0 :Text;
  version @1 :UInt64;
  metadata @2 :Text;
  tokens @3 :UInt64;
  model @4 :Data;
  chunks @5 :UInt32;        # keys of the document
  chunksHeld @6 :UInt32;    # of them, the chunks some tier of the node holds now
  pinned @7 :Bool;          # pinned, and its deadline (if any) not passed
  pinExpiresMs @8 :UInt64;  # the pin's deadline on the node's wall clock (ms since the epoch); 0: none
  registeredMs @9 :UInt64;  # when this version was registered, on the node's wall clock
  hits @10 :UInt64;         # chunks of this document served by get since it was registered
}
