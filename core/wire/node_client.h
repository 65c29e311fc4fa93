// SPDX-License-Identifier: Apache-2.0
// The client side of kdnd's protocol (wire/node.capnp), shared by everything
// that talks to a node (the remote tier, the dashboard): where the node is
// and how to reach it (address, token, TLS), connecting and logging in, and
// what a refusal or a lost connection means, as a Status and for a human.
//
// Each user runs its own kj event loop on its own thread (the remote tier's
// calls, the dashboard's pushes) and keeps its own reconnect policy; a
// NodeConnector is made for one loop and used on it only.
// Thread-safety: NodeConnector and NodeConnection belong to the loop thread
// that uses them (Create may run on another thread before); the free
// functions are pure.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include <capnp/rpc-twoparty.h>
#include <capnp/rpc.h>
#include <kj/async-io.h>
#include <kj/compat/tls.h>

#include "core/util/status.h"
#include "core/wire/message_stream.h"
#include "core/wire/node.capnp.h"

namespace kdn::wire {

// Where a node is and how to log in.
struct NodeEndpoint {
  std::string address;          // "host:port", "[v6]:port" or "unix:/path"
  std::string token;            // a bearer token of the node's [[token]] table
  std::string tls_ca_file;      // PEM: the certificate(s) to trust; "": plain TCP
  std::string tls_server_name;  // what the node's certificate must name; "": the address's host
};

// Whether `address` is one a node can be reached at ("host:port",
// "[v6]:port" with a port of 1-65535, or "unix:/path" that fits a socket
// address) or, with `listening`, one it can listen at (port 0: any; host
// "*": every interface). kInvalidArgument saying what is wrong; the name is
// not resolved (that is the connection's business).
Status CheckNodeAddress(std::string_view address, bool listening = false);

// The name the node's certificate must carry: tls_server_name, else the
// address's host (without the brackets of an IPv6 literal).
std::string TlsServerName(const NodeEndpoint& endpoint);

// A call the node answered with a typed error other than ok, as a Status:
// unauthenticated and permissionDenied are kPermissionDenied, tooLarge
// kTooLarge, the others their namesakes. The message reads "kdnd refused
// <call>: <why>" (a bad token, a missing grant, draining, the node's text).
Status RefusalStatus(std::string_view call, node::Error::Reader error);
// The same as an exception, for promise chains: IsRefusal tells it from a
// transport failure (the node answered; nothing is wrong with the link).
kj::Exception RefusalException(std::string_view call, node::Error::Reader error);
bool IsRefusal(const kj::Exception& e);
// Why a connection attempt, a connection or a call ended, for a human:
// "connection refused", "no answer from kdnd within N ms", "kdnd closed the
// connection (...)", a refusal's own message, or "cannot reach kdnd: ...".
std::string DescribeFailure(const kj::Exception& e, std::uint32_t timeout_ms);

// One connection to a node, logged in.
class NodeConnection {
 public:
  explicit NodeConnection(kj::Own<kj::AsyncIoStream>&& stream);
  node::KdnNode::Client node() { return node_; }
  node::Session::Client session() { return session_; }
  // Resolves (or rejects) when the connection is lost.
  kj::Promise<void> onDisconnect() { return network_.onDisconnect(); }
  // The connection's message buffers (message_stream.h): what a call puts
  // into a request from memory of its own is held here until written, and
  // a reply's bytes can be kept where they arrived.
  StreamBuffers& buffers() { return *buffers_; }

 private:
  friend class NodeConnector;
  kj::Own<kj::AsyncIoStream> stream_;
  std::shared_ptr<StreamBuffers> buffers_;
  BulkMessageStream messages_;
  capnp::TwoPartyVatNetwork network_;
  capnp::RpcSystem<capnp::rpc::twoparty::VatId> rpc_;
  node::KdnNode::Client node_;
  node::Session::Client session_;
};

class NodeConnector {
 public:
  // Checks the endpoint (an address, a token) and reads the TLS CA file:
  // kInvalidArgument naming what is wrong.
  static Result<std::unique_ptr<NodeConnector>> Create(NodeEndpoint endpoint);

  // On the loop thread: connects (through TLS when configured), logs in,
  // and resolves to the connection; rejects with the transport's failure or
  // a refusal (IsRefusal: a bad token).
  kj::Promise<kj::Own<NodeConnection>> Connect(kj::Network& network);

  const NodeEndpoint& endpoint() const { return endpoint_; }

 private:
  explicit NodeConnector(NodeEndpoint endpoint) : endpoint_(std::move(endpoint)) {}
  NodeEndpoint endpoint_;
  kj::Own<kj::TlsCertificate> trusted_;  // null: plain TCP
  kj::Own<kj::TlsContext> tls_;
  kj::String server_name_;
};

}  // namespace kdn::wire
