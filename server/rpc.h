// SPDX-License-Identifier: Apache-2.0
// kdnd's transport: the node service (server/service.h) as the Cap'n Proto
// interfaces of core/wire/node.capnp. Each handler reads and bounds-checks
// its request (sizes, key counts: a malformed message gets a typed
// invalidArgument, never an exception), calls the service, and writes its
// reply; the service's Status codes become the schema's ErrorCode one to
// one (kPermissionDenied is permissionDenied, kTooLarge tooLarge, ...), and
// an unknown token at login is unauthenticated.
// Thread-safety: the capabilities live on the event loop that serves them;
// the service they call is thread-safe.
#pragma once

#include <memory>
#include <string>

#include <capnp/capability.h>
#include <kj/timer.h>

#include "core/wire/message_stream.h"
#include "core/wire/node.capnp.h"
#include "server/service.h"

namespace kdn::server {

// The bootstrap capability of a connection (KdnNode). `timer` paces the
// statistics pushes; both must outlive every connection. `buffers`: the
// connection's (core/wire/message_stream.h), through which its sessions
// reply with stored envelopes in place; null: they copy them into replies.
// `max_login_failures`: failed logins on the connection before it is
// closed (each answered later than the last); 0: no limit (tests).
// `max_subscriptions`: statistics subscriptions its sessions hold at once.
capnp::Capability::Client MakeNodeBootstrap(NodeService& service, kj::Timer& timer, const std::string& version,
                                            std::shared_ptr<wire::StreamBuffers> buffers = nullptr,
                                            std::uint32_t max_login_failures = 0, std::uint32_t max_subscriptions = 4);
// A session for a grant, as login makes it (tests and the fuzz target call
// its methods as local capabilities, through the same handlers).
wire::node::Session::Client MakeSession(NodeService& service, kj::Timer& timer, const Grant& grant,
                                        std::shared_ptr<wire::StreamBuffers> buffers = nullptr);

}  // namespace kdn::server
