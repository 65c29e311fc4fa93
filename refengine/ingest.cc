// SPDX-License-Identifier: Apache-2.0
#include "refengine/ingest.h"

#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "core/keys/hash.h"
#include "refengine/ref_engine.h"

namespace kdn::refengine {

namespace fs = std::filesystem;

const char* OutcomeName(FileOutcome outcome) {
  switch (outcome) {
    case FileOutcome::kIngested: return "ingested";
    case FileOutcome::kReplaced: return "replaced";
    case FileOutcome::kUnchanged: return "unchanged";
    case FileOutcome::kEmpty: return "empty";
    case FileOutcome::kBinary: return "binary";
    case FileOutcome::kUnreadable: return "unreadable";
    case FileOutcome::kTooLarge: return "too large";
    case FileOutcome::kChanged: return "changed";
    case FileOutcome::kFailed: return "failed";
  }
  return "?";
}

namespace {

bool Hidden(const fs::path& p) { return !p.filename().empty() && p.filename().string()[0] == '.'; }

// Valid UTF-8 (no overlongs, surrogates or code points past U+10FFFF) and no NUL.
bool IsText(const std::string& s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  for (size_t i = 0; i < n;) {
    const unsigned c = p[i];
    if (c == 0) return false;
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len;
    unsigned cp;
    if ((c & 0xE0) == 0xC0) len = 2, cp = c & 0x1F;
    else if ((c & 0xF0) == 0xE0) len = 3, cp = c & 0x0F;
    else if ((c & 0xF8) == 0xF0) len = 4, cp = c & 0x07;
    else return false;
    if (i + len > n) return false;
    for (size_t k = 1; k < len; ++k) {
      if ((p[i + k] & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (p[i + k] & 0x3F);
    }
    if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) || cp > 0x10FFFF ||
        (cp >= 0xD800 && cp <= 0xDFFF)) {
      return false;
    }
    i += len;
  }
  return true;
}

bool Blank(const std::string& s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; });
}

// The longest knowledge item id (kdn_knowledge_put's doc_id).
constexpr size_t kMaxItemIdBytes = 255;

// What identifies a file's content on disk, to see it change.
struct Stamp {
  std::uint64_t size = 0, ino = 0;
  std::int64_t mtime_ns = 0, ctime_ns = 0;
  bool operator==(const Stamp&) const = default;
};

Stamp StampOfStat(const struct stat& sb) {
  Stamp s;
  s.size = static_cast<std::uint64_t>(sb.st_size);
  s.ino = static_cast<std::uint64_t>(sb.st_ino);
  s.mtime_ns = static_cast<std::int64_t>(sb.st_mtim.tv_sec) * 1000000000 + sb.st_mtim.tv_nsec;
  s.ctime_ns = static_cast<std::int64_t>(sb.st_ctim.tv_sec) * 1000000000 + sb.st_ctim.tv_nsec;
  return s;
}

// A file descriptor, closed when it goes.
struct Fd {
  int fd = -1;
  explicit Fd(int f = -1) : fd(f) {}
  Fd(Fd&& o) noexcept : fd(o.fd) { o.fd = -1; }
  Fd& operator=(Fd&& o) noexcept {
    std::swap(fd, o.fd);
    return *this;
  }
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

// Opens `rel` (relative, '/'-separated, no "." or ".." component) under
// the directory `dir_fd` for reading, following no symbolic link on the way
// and never blocking (a FIFO opens at once, and fstat then says what it is):
// openat2 with RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS where the kernel has
// it, else one component at a time with O_NOFOLLOW. A file or directory
// swapped for a link after the listing is refused (ELOOP, ENOTDIR), never
// followed out of the directory. -1 with errno on failure.
int OpenBeneath(int dir_fd, const std::string& rel) {
  constexpr int kFileFlags = O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | O_NOCTTY;
  open_how how{};
  how.flags = kFileFlags;
  how.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;
  const long fd = ::syscall(SYS_openat2, dir_fd, rel.c_str(), &how, sizeof how);
  if (fd >= 0 || (errno != ENOSYS && errno != EPERM)) return static_cast<int>(fd);  // EPERM: a seccomp filter
  Fd at(::fcntl(dir_fd, F_DUPFD_CLOEXEC, 0));
  if (at.fd < 0) return -1;
  size_t begin = 0;
  for (;;) {
    const size_t slash = rel.find('/', begin);
    const std::string part = rel.substr(begin, slash == std::string::npos ? std::string::npos : slash - begin);
    if (part.empty() || part == "." || part == "..") {
      errno = EINVAL;
      return -1;
    }
    if (slash == std::string::npos) return ::openat(at.fd, part.c_str(), kFileFlags);
    Fd next(::openat(at.fd, part.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (next.fd < 0) return -1;
    at = std::move(next);
    begin = slash + 1;
  }
}

// What is at `rel` under `dir_fd` now, without following a link at its end.
Result<Stamp> StampAt(int dir_fd, const std::string& rel) {
  struct stat sb {};
  if (::fstatat(dir_fd, rel.c_str(), &sb, AT_SYMLINK_NOFOLLOW) != 0) {
    return Status::Internal(std::string("cannot stat: ") + std::strerror(errno));
  }
  return StampOfStat(sb);
}

// The tokenizer merges greedily over its whole input (quadratic in its
// length), so text is encoded in pieces of at most ~2 KiB: paragraphs (each
// with the blank lines after it), long ones cut after a line break or a
// space. Each piece gets the tokenizer's dummy-prefix space.
std::vector<int> Tokenize(const model::Tokenizer& tok, const std::string& text) {
  constexpr size_t kPiece = 2048;
  std::vector<int> out;
  size_t at = 0;
  while (at < text.size()) {
    size_t end = text.find("\n\n", at);
    end = end == std::string::npos ? text.size() : end;
    while (end < text.size() && text[end] == '\n') ++end;  // the blank lines go with the paragraph
    if (end - at > kPiece) {
      const size_t limit = at + kPiece;
      size_t cut = text.rfind('\n', limit);
      if (cut == std::string::npos || cut <= at) cut = text.rfind(' ', limit);
      end = (cut == std::string::npos || cut <= at) ? limit : cut + 1;
      // Never inside a UTF-8 sequence.
      while (end > at + 1 && end < text.size() && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) --end;
    }
    const std::vector<int> piece = tok.Encode(std::string_view(text).substr(at, end - at), /*bos=*/false);
    out.insert(out.end(), piece.begin(), piece.end());
    at = end;
  }
  return out;
}

// Part boundaries: parts of at most `max` tokens, each cut after the last
// token holding a line break in its last quarter when there is one.
std::vector<std::pair<size_t, size_t>> Split(const model::Tokenizer& tok, const std::vector<int>& tokens, size_t max) {
  std::vector<std::pair<size_t, size_t>> parts;
  size_t at = 0;
  while (at < tokens.size()) {
    size_t end = std::min(tokens.size(), at + max);
    if (end < tokens.size()) {
      for (size_t i = end; i > at + max * 3 / 4; --i) {
        if (tok.Decode(tokens[i - 2 < at ? at : i - 2], tokens[i - 1]).find('\n') != std::string::npos) {
          end = i;
          break;
        }
      }
    }
    parts.emplace_back(at, end);
    at = end;
  }
  return parts;
}

std::string ItemId(const std::string& path, size_t part, size_t parts) {
  return parts == 1 ? path : path + "#" + std::to_string(part + 1);
}

// What the runtime's index holds now for this namespace, by file: each
// item's part number (0: the unsplit "PATH"), version and wholeness.
struct Held {
  std::uint64_t version = 0;
  bool whole = false;
  std::uint32_t parts = 0;  // its part number from the doc_id ("PATH#K"); 0: the unsplit "PATH"
  std::string doc_id;
};
using HeldMap = std::map<std::string, std::vector<Held>>;  // path -> its items

Result<HeldMap> ListHeld(kdn_model* model, const std::string& ns) {
  size_t count = 0;
  std::vector<kdn_document_info> docs;
  for (;;) {
    kdn_document_info init = KDN_DOCUMENT_INFO_INIT;
    docs.assign(count + 16, init);
    size_t n = 0;
    KDN_RETURN_IF_ERROR(FromKdn(kdn_knowledge_list(model, ns.data(), ns.size(), docs.data(), docs.size(), &n),
                                "kdn_knowledge_list"));
    if (n <= docs.size()) {
      docs.resize(n);
      break;
    }
    count = n;  // more were put meanwhile: ask again
  }
  HeldMap held;
  for (const kdn_document_info& d : docs) {
    Held h;
    h.doc_id.assign(d.doc_id, d.doc_id_len);
    h.version = d.version;
    h.whole = d.chunks_present == d.chunks;
    // Which file and part, from the doc_id ("PATH" or "PATH#K").
    std::string path = h.doc_id;
    if (const size_t hash = path.rfind('#'); hash != std::string::npos) {
      const std::string k = path.substr(hash + 1);
      if (!k.empty() && k.size() < 9 && std::all_of(k.begin(), k.end(), [](char c) { return c >= '0' && c <= '9'; })) {
        h.parts = static_cast<std::uint32_t>(std::stoul(k));  // the part's number, 1-based
        path.resize(hash);
      }
    }
    held[path].push_back(std::move(h));
  }
  return held;
}

}  // namespace

std::string PrintableName(const std::string& name) {
  const bool text = IsText(name);
  std::string out;
  for (const char ch : name) {
    const auto c = static_cast<unsigned char>(ch);
    if (c < 0x20 || c == 0x7F || c == '\\' || (!text && c >= 0x80)) {
      char buf[5];
      std::snprintf(buf, sizeof buf, "\\x%02X", c);
      out += buf;
    } else {
      out += ch;
    }
  }
  return out;
}

std::uint64_t ContentVersion(const std::string& content) {
  keys::Hasher h;
  h.Bytes(content.data(), content.size());
  const keys::Digest d = h.Finish();
  std::uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= std::uint64_t{d[static_cast<size_t>(i)]} << (8 * i);
  return v == 0 ? 1 : v;
}

Result<std::vector<FoundFile>> FindDocuments(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return Status::InvalidArgument("not a directory: " + dir);
  std::vector<FoundFile> out;
  fs::recursive_directory_iterator it(dir, fs::directory_options::skip_permission_denied, ec);
  if (ec) return Status::InvalidArgument("cannot read " + dir + ": " + ec.message());
  for (; it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (ec) return Status::Internal("cannot read " + dir + ": " + ec.message());
    const fs::directory_entry& e = *it;
    if (Hidden(e.path())) {
      if (e.is_directory(ec) && !e.is_symlink(ec)) it.disable_recursion_pending();
      continue;
    }
    if (e.is_symlink(ec) || !e.is_regular_file(ec)) continue;  // links are not followed
    FoundFile f;
    f.path = fs::relative(e.path(), dir, ec).generic_string();
    f.bytes = e.file_size(ec);
    if (ec) f.bytes = 0;
    out.push_back(std::move(f));
  }
  std::sort(out.begin(), out.end(), [](const FoundFile& a, const FoundFile& b) { return a.path < b.path; });
  return out;
}

Result<kdn_runtime*> OpenStore(const StoreOptions& o) {
  kdn_tier_config tiers[2] = {KDN_TIER_CONFIG_INIT, KDN_TIER_CONFIG_INIT};
  tiers[0].kind = KDN_TIER_HOST;
  tiers[0].capacity_bytes = o.host_bytes;
  tiers[0].write_through = 1;
  tiers[1].kind = KDN_TIER_DISK;
  tiers[1].capacity_bytes = o.capacity;
  tiers[1].path = o.dir.data();
  tiers[1].path_len = o.dir.size();
  tiers[1].codec = o.codec.data();
  tiers[1].codec_len = o.codec.size();
  kdn_runtime_options ro = KDN_RUNTIME_OPTIONS_INIT;
  ro.chunk_tokens = o.chunk_tokens;
  ro.tiers = tiers;
  ro.num_tiers = 2;
  ro.device = KDN_DEVICE_NONE;
  kdn_runtime* rt = nullptr;
  KDN_RETURN_IF_ERROR(FromKdn(kdn_runtime_create(&ro, &rt), "the store " + o.dir));
  return rt;
}

Result<IngestSummary> Ingest(const LoadedModel& model, kdn_runtime* runtime, const IngestOptions& options,
                             const std::atomic<bool>* stop, const IngestEventFn& on_event) {
  const auto t0 = std::chrono::steady_clock::now();
  auto files = FindDocuments(options.dir);
  if (!files.ok()) return files.status();
  // Every file is opened under this descriptor of the directory listed.
  Fd root(::open(options.dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (root.fd < 0) return Status::InvalidArgument("cannot open " + options.dir + ": " + std::strerror(errno));
  if (options.after_listing) options.after_listing();
  const int context = model.weights->config().seq_len;
  const size_t max_tokens = options.max_tokens == 0 ? static_cast<size_t>(context)
                                                    : std::min<size_t>(options.max_tokens, static_cast<size_t>(context));
  const int workers = options.workers > 0 ? options.workers
                                          : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::vector<std::unique_ptr<RefEngine>> engines;
  for (int w = 0; w < workers; ++w) {
    auto e = RefEngine::Create(model, runtime, /*threads=*/1);
    if (!e.ok()) return e.status();
    engines.push_back(std::move(e).value());
  }
  kdn_model* km = engines[0]->model();
  HeldMap held;
  if (options.store) {
    auto h = ListHeld(km, options.ns);
    if (!h.ok()) return h.status();
    held = std::move(h).value();
  }

  IngestSummary sum;
  sum.workers = workers;
  IngestProgress progress;
  progress.files_total = files->size();
  for (const FoundFile& f : *files) progress.bytes_total += f.bytes;
  std::mutex mu;  // sum, progress, the callback
  std::atomic<size_t> next{0};

  const auto report = [&](FileEvent ev, std::uint64_t prefill_ns, std::uint64_t put_ns, std::uint64_t items,
                          std::uint64_t deleted) {
    std::lock_guard<std::mutex> lock(mu);
    ++sum.files;
    ++sum.by_outcome[static_cast<int>(ev.outcome)];
    sum.prefill_ns += prefill_ns;
    sum.put_ns += put_ns;
    sum.items += items;
    sum.deleted += deleted;
    if (!Skipped(ev.outcome)) {
      sum.tokens += ev.tokens;
      sum.bytes += ev.bytes;
      progress.tokens_done += ev.tokens;
    }
    ++progress.files_done;
    progress.bytes_done += ev.bytes;
    progress.elapsed_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (on_event) on_event(ev, progress);
  };
  const auto erase = [&](kdn_model* m, const std::string& id) {
    return kdn_knowledge_delete(m, options.ns.data(), options.ns.size(), id.data(), id.size()) == KDN_OK;
  };

  const auto work = [&](RefEngine& engine) {
    kdn_model* m = engine.model();
    for (;;) {
      if (stop && stop->load()) return;
      const size_t i = next.fetch_add(1);
      if (i >= files->size()) return;
      const FoundFile& f = (*files)[i];
      FileEvent ev;
      ev.path = f.path;
      ev.bytes = f.bytes;
      const auto skip = [&](FileOutcome o, std::string detail) {
        ev.outcome = o;
        ev.detail = std::move(detail);
        report(ev, 0, 0, 0, 0);
      };
      // Its path names its items: text (and, below, short enough for an id).
      if (!IsText(f.path)) {
        skip(FileOutcome::kUnreadable, "its name is not UTF-8 text (item ids are): rename it to ingest it");
        continue;
      }
      // Opened under the listed directory following no link (one swapped in
      // since the listing is refused), without blocking (a FIFO); read
      // whole from that descriptor, seeing whether it changed meanwhile.
      Fd fd(OpenBeneath(root.fd, f.path));
      if (fd.fd < 0) {
        const int e = errno;
        skip(FileOutcome::kUnreadable, e == ELOOP || e == EXDEV || e == ENOTDIR
                                           ? std::string("a symbolic link now, or under one (links are not followed)")
                                           : std::string("cannot open: ") + std::strerror(e));
        continue;
      }
      struct stat sb {};
      if (::fstat(fd.fd, &sb) != 0) {
        skip(FileOutcome::kUnreadable, std::string("cannot stat: ") + std::strerror(errno));
        continue;
      }
      if (!S_ISREG(sb.st_mode)) {
        skip(FileOutcome::kUnreadable, "not a regular file now (a FIFO, device or directory is not read)");
        continue;
      }
      const Stamp before = StampOfStat(sb);
      ev.bytes = before.size;
      if (before.size > options.max_file_bytes) {
        skip(FileOutcome::kTooLarge, std::to_string(before.size) + " bytes, over the limit of " +
                                         std::to_string(options.max_file_bytes));
        continue;
      }
      std::string content(static_cast<size_t>(before.size) + 1, '\0');  // one more: a file that grew shows it
      size_t got = 0;
      bool read_failed = false;
      while (got < content.size()) {
        const ssize_t n = ::read(fd.fd, content.data() + got, content.size() - got);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
          read_failed = true;
          break;
        }
        if (n == 0) break;
        got += static_cast<size_t>(n);
      }
      if (read_failed) {
        skip(FileOutcome::kUnreadable, std::string("cannot read: ") + std::strerror(errno));
        continue;
      }
      content.resize(got);
      struct stat sa {};
      if (::fstat(fd.fd, &sa) != 0 || !(StampOfStat(sa) == before) || content.size() != before.size) {
        skip(FileOutcome::kChanged, "it changed while it was read");
        continue;
      }
      if (Blank(content)) {
        skip(FileOutcome::kEmpty, content.empty() ? "no bytes" : "only whitespace");
        continue;
      }
      if (!IsText(content)) {
        skip(FileOutcome::kBinary, "not UTF-8 text");
        continue;
      }
      const std::uint64_t version = ContentVersion(content);
      const std::vector<int> tokens = Tokenize(*model.tokenizer, content);
      const auto parts = Split(*model.tokenizer, tokens, max_tokens);
      ev.tokens = tokens.size();
      ev.parts = static_cast<std::uint32_t>(parts.size());
      const size_t longest = parts.empty() ? 0 : ItemId(f.path, parts.size() - 1, parts.size()).size();
      if (longest > kMaxItemIdBytes) {
        skip(FileOutcome::kUnreadable, "its item id would be " + std::to_string(longest) + " bytes, over the " +
                                           std::to_string(kMaxItemIdBytes) + " a knowledge item id may take");
        continue;
      }
      std::vector<Held> mine;
      if (auto h = held.find(f.path); h != held.end()) mine = h->second;  // read-only after the listing
      // Unchanged: exactly the items this run would put, at this version, whole.
      bool unchanged = options.store && mine.size() == parts.size();
      for (const Held& h : mine) {
        const bool expected = parts.size() == 1 ? h.parts == 0 : (h.parts >= 1 && h.parts <= parts.size());
        unchanged = unchanged && expected && h.version == version && h.whole;
      }
      if (unchanged) {
        ev.outcome = FileOutcome::kUnchanged;
        report(ev, 0, 0, 0, 0);
        continue;
      }
      std::uint64_t prefill_ns = 0, put_ns = 0, items = 0, deleted = 0;
      Status failed;
      bool changed = false;
      std::vector<std::string> put_ids;
      for (size_t p = 0; p < parts.size() && failed.ok() && !changed; ++p) {
        const std::span<const int> span(tokens.data() + parts[p].first, parts[p].second - parts[p].first);
        if (!options.store) {
          auto ns = engine.PrefillOnly(span);
          if (!ns.ok()) failed = ns.status();
          else prefill_ns += *ns;
          continue;
        }
        const std::string id = ItemId(f.path, p, parts.size());
        const std::string meta = nlohmann::json{{"path", f.path},
                                                {"part", p + 1},
                                                {"parts", parts.size()},
                                                {"bytes", content.size()}}
                                     .dump();
        std::uint64_t pre = 0, put = 0;
        const Status st = engine.PutDocument(options.ns, id, version, meta, span, &pre, &put, [&]() -> Status {
          if (options.before_put) options.before_put(f.path);
          auto now = StampAt(root.fd, f.path);  // the path still names the file read, unchanged
          if (!now.ok() || !(*now == before)) {
            changed = true;
            return Status(Code::kCancelled, "changed");
          }
          return Status::Ok();
        });
        prefill_ns += pre;
        put_ns += put;
        if (changed) break;
        if (!st.ok()) {
          failed = st;
          break;
        }
        put_ids.push_back(id);
        ++items;
        if (options.pin_ttl_ms >= 0) {
          const kdn_status ps = kdn_knowledge_pin(m, options.ns.data(), options.ns.size(), id.data(), id.size(),
                                                  options.pin_ttl_ms);
          if (ps != KDN_OK) failed = FromKdn(ps, "kdn_knowledge_pin");
        }
      }
      if (changed || !failed.ok()) {
        // All or nothing: the parts this run put of it go again (an older
        // version they replaced is gone with them; the next run puts it).
        for (const std::string& id : put_ids) deleted += erase(m, id);
        ev.outcome = changed ? FileOutcome::kChanged : FileOutcome::kFailed;
        ev.detail = changed ? "it changed while it was ingested" : failed.message();
        report(ev, prefill_ns, put_ns, 0, deleted);
        continue;
      }
      // Items of an earlier version that this one no longer makes.
      for (const Held& h : mine) {
        if (std::find(put_ids.begin(), put_ids.end(), h.doc_id) == put_ids.end()) deleted += erase(m, h.doc_id);
      }
      ev.outcome = mine.empty() || !options.store ? FileOutcome::kIngested : FileOutcome::kReplaced;
      report(ev, prefill_ns, put_ns, items, deleted);
    }
  };

  std::vector<std::thread> threads;
  for (int w = 1; w < workers; ++w) threads.emplace_back(work, std::ref(*engines[static_cast<size_t>(w)]));
  work(*engines[0]);
  for (std::thread& t : threads) t.join();

  sum.left = files->size() - sum.files;
  sum.interrupted = sum.left != 0;
  if (options.store && options.prune && !sum.interrupted) {
    // Items whose file is gone (only paths this ingestion names: ours).
    std::map<std::string, bool> present;
    for (const FoundFile& f : *files) present[f.path] = true;
    for (const auto& [path, items] : held) {
      if (present.count(path)) continue;
      for (const Held& h : items) sum.deleted += erase(km, h.doc_id);
    }
  }
  sum.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return sum;
}

}  // namespace kdn::refengine
