// SPDX-License-Identifier: Apache-2.0
#include "token_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace kdn::dash {

bool ReadTokenFile(const std::string& path, std::string* token, std::string* error) {
  constexpr off_t kMaxBytes = 64 << 10;
  // Checked on the open descriptor, so the file checked is the file read.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    *error = path + ": cannot open the token file: " + std::strerror(errno);
    return false;
  }
  struct stat st {};
  bool ok = false;
  if (::fstat(fd, &st) != 0) {
    *error = path + ": cannot stat: " + std::strerror(errno);
  } else if (!S_ISREG(st.st_mode)) {
    *error = path + ": not a regular file";
  } else if ((st.st_mode & 077) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    *error = path + ": mode " + mode + " lets group or others read the token; refused (as kdnd refuses it): chmod 600 " +
             path;
  } else if (st.st_size > kMaxBytes) {
    *error = path + ": " + std::to_string(st.st_size) + " bytes is not a token file (at most 64 KiB)";
  } else {
    std::string data(static_cast<size_t>(st.st_size), '\0');
    size_t done = 0;
    ok = true;
    while (done < data.size()) {
      const ssize_t n = ::read(fd, data.data() + done, data.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        *error = path + ": cannot read: " + std::strerror(errno);
        ok = false;
        break;
      }
      if (n == 0) break;
      done += static_cast<size_t>(n);
    }
    data.resize(done);
    while (!data.empty() && static_cast<unsigned char>(data.back()) <= 0x20) data.pop_back();
    if (ok && data.empty()) {
      *error = path + ": the token file is empty";
      ok = false;
    }
    for (char c : data) {
      if (ok && (static_cast<unsigned char>(c) <= 0x20 || c == 0x7f)) {
        *error = path + ": the token has whitespace or control characters in it (one word, one line)";
        ok = false;
      }
    }
    if (ok) *token = std::move(data);
  }
  ::close(fd);
  return ok;
}

}  // namespace kdn::dash
